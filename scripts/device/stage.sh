#!/usr/bin/env bash
# Split a large file (a model) for the GPU machine, whose calls carry at most 64 MiB each:
#   bash scripts/device/stage.sh FILE NAME [PART_MIB]      (here)
# gzips FILE (-9: ~4 % off a Q4 GGUF), splits it into .stage/NAME/part.NN of PART_MIB (default: what a call
# has room for beside the working tree, 63 MiB minus its size) and writes .stage/NAME/manifest: the file's
# name, size and sha256 and each part's sha256. .stage/ is git-ignored (.git/info/exclude): nothing travels
# unless a call carries it. Then make one device call per part, back to back (the machine's /tmp lives only while it stays warm,
# 30 s after a call), each carrying ".stage/NAME/manifest" and ".stage/NAME/part.NN" and running
#   bash scripts/device/unstage.sh NAME
# which keeps the part in /tmp/crisp_stage/NAME and, once every part is there, assembles the file and checks
# its sha256 before printing "READY <path>" (and exits 1 on any checksum mismatch).
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: stage.sh FILE NAME [PART_MIB]" >&2; exit 2; }
[ -f "$1" ] || { echo "stage.sh: FILE $1: no such file" >&2; exit 2; }
FILE=$(realpath "$1") NAME=$2
cd "$(git -C "$(dirname "$0")" rev-parse --show-toplevel)"
# what a call carries besides the parts: tracked and untracked-not-ignored files, on-disk size (the apparent one
# under-counts); files deleted from the tree are skipped
TREE=$(( $(git ls-files -z --cached --others --exclude-standard | du -ck --files0-from=- 2>/dev/null | tail -1 | cut -f1) * 1024 ))
ROOM=$(( 63 - (TREE + 1048575) / 1048576 ))
[ $# -ge 3 ] || [ "$ROOM" -ge 1 ] || { echo "stage.sh: the working tree ($((TREE / 1048576)) MiB) leaves no room in a 64 MiB call" >&2; exit 2; }
MIB=${3:-$(( ROOM > 60 ? 60 : ROOM ))}
[[ "$NAME" =~ ^[A-Za-z0-9_.-]+$ ]] || { echo "stage.sh: NAME $NAME: expected letters, digits, . _ -" >&2; exit 2; }
[[ "$MIB" =~ ^[0-9]+$ ]] && [ "$MIB" -ge 1 ] && [ "$MIB" -le 60 ] || { echo "stage.sh: PART_MIB $MIB: expected 1..60" >&2; exit 2; }
grep -qx '/.stage/' .git/info/exclude 2>/dev/null || { mkdir -p .git/info; echo '/.stage/' >> .git/info/exclude; }
DIR=.stage/$NAME
rm -rf "$DIR" && mkdir -p "$DIR"
gzip -9 -c "$FILE" | split -d -a 2 -b "${MIB}M" - "$DIR/part."
{
  echo "file $(basename "$FILE") $(stat -c %s "$FILE") $(sha256sum "$FILE" | cut -d' ' -f1)"
  (cd "$DIR" && sha256sum part.* | awk '{print "part", $2, $1}')
} > "$DIR/manifest"
cat "$DIR/manifest"
echo "stage.sh: $(ls "$DIR"/part.* | wc -l) parts of $MIB MiB in $DIR; working tree: $((TREE / 1048576)) MiB"
