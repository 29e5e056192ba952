#!/usr/bin/env bash
# The device side of scripts/device/stage.sh: bash scripts/device/unstage.sh NAME [STAGE_DIR]
# Moves the parts this call carried (.stage/NAME/part.NN, each checked against the manifest) into
# STAGE_DIR/NAME (default /tmp/crisp_stage), reports which parts are still missing and, once all are there,
# assembles the file, checks its size and sha256 and prints "READY <path>". Exit 1 on a bad checksum.
set -euo pipefail
NAME=${1:?usage: unstage.sh NAME [STAGE_DIR]}
STAGE=${2:-/tmp/crisp_stage}/$NAME
cd "$(dirname "$0")/../.."
SRC=.stage/$NAME
MAN=$SRC/manifest
[ -f "$MAN" ] || MAN=$STAGE/manifest
[ -f "$MAN" ] || { echo "unstage.sh: no manifest for $NAME (carry .stage/$NAME/manifest)" >&2; exit 1; }
mkdir -p "$STAGE"
cp "$MAN" "$STAGE/manifest.new" && mv "$STAGE/manifest.new" "$STAGE/manifest"
read -r _ FILE SIZE SHA < <(grep '^file ' "$STAGE/manifest")
TARGET=$STAGE/$FILE
if [ -f "$TARGET" ] && [ "$(stat -c %s "$TARGET")" = "$SIZE" ]; then echo "READY $TARGET"; exit 0; fi
missing=()
while read -r _ PART PSHA; do
  if [ -f "$SRC/$PART" ] && [ ! -f "$STAGE/$PART" ]; then
    [ "$(sha256sum "$SRC/$PART" | cut -d' ' -f1)" = "$PSHA" ] || { echo "unstage.sh: $PART: checksum mismatch" >&2; exit 1; }
    cp "$SRC/$PART" "$STAGE/$PART"
  fi
  [ -f "$STAGE/$PART" ] || missing+=("$PART")
done < <(grep '^part ' "$STAGE/manifest")
if [ ${#missing[@]} -gt 0 ]; then echo "unstage.sh: $NAME: waiting for ${missing[*]}"; exit 0; fi
cat "$STAGE"/part.* | gunzip -c > "$TARGET.partial"
[ "$(sha256sum "$TARGET.partial" | cut -d' ' -f1)" = "$SHA" ] || { rm -f "$TARGET.partial"; echo "unstage.sh: $FILE: sha256 mismatch after assembly" >&2; exit 1; }
mv "$TARGET.partial" "$TARGET" && rm -f "$STAGE"/part.*
echo "READY $TARGET"
