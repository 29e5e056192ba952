"""python -m crisp_trt.builder == crisp-build."""
import sys

from .cli import main

sys.exit(main())
