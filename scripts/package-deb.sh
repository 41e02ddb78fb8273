#!/bin/sh
# Builds dist/vmsr-helper_VERSION_ARCH.deb with dpkg-deb alone (no debhelper): `npm run package:deb`.
# What goes where and why: docs/packaging.md. Needs npm, dpkg-deb and the npm cache or registry for
# the production modules (taken from package-lock.json, so the same versions the tests ran with).
# Usage: scripts/package-deb.sh [--tarball FILE] [--out DIR]
#   --tarball FILE  package this `npm pack` output instead of packing (and so building) the clone now
#   --out DIR       where the .deb goes (default dist/)
set -eu
cd "$(dirname "$0")/.."
REPO=$PWD
TARBALL=""
OUT=$REPO/dist
while [ $# -gt 0 ]; do
  case "$1" in
    --tarball) TARBALL=$(realpath "$2"); shift 2 ;;
    --out) OUT=$(realpath -m "$2"); shift 2 ;;
    *) echo "cannot build the .deb: unknown argument '$1'; usage: $0 [--tarball FILE] [--out DIR]" >&2; exit 2 ;;
  esac
done
for tool in npm dpkg-deb dpkg; do
  command -v "$tool" >/dev/null || { echo "cannot build the .deb: $tool is not installed; install it (apt-get install dpkg npm)" >&2; exit 1; }
done

NAME=vmsr-helper
VERSION=$(node -p "require('./package.json').version")
ARCH=$(dpkg --print-architecture)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
STAGE=$WORK/root
LIB=$STAGE/usr/lib/$NAME

# 1. The npm package (dist/ built by `prepare` while packing), unpacked where the .deb keeps it.
if [ -z "$TARBALL" ]; then
  TARBALL=$WORK/$(npm pack --pack-destination "$WORK" --loglevel=error | tail -n 1)
fi
mkdir -p "$LIB"
tar -xzf "$TARBALL" -C "$LIB" --strip-components=1 --no-same-owner

# 2. Production modules only, at the versions of package-lock.json; no scripts: koffi's native part
#    comes prebuilt in its per-platform package, and `prepare` (tsc) must not run.
cp package-lock.json "$LIB/"
( cd "$LIB" && { npm ci --omit=dev --ignore-scripts --offline --no-audit --no-fund --loglevel=error 2>/dev/null ||
  npm ci --omit=dev --ignore-scripts --prefer-offline --no-audit --no-fund --loglevel=error; } )
rm -f "$LIB/package-lock.json" "$LIB/node_modules/.package-lock.json"
# The documentation goes to /usr/share/doc; the units and the default file to /etc (below).
mkdir -p "$STAGE/usr/share/doc/$NAME"
mv "$LIB/docs" "$LIB/README.md" "$STAGE/usr/share/doc/$NAME/"
cp "$LIB/LICENSE" "$STAGE/usr/share/doc/$NAME/copyright"

# 3. The command: a relative link, as npm makes, so the script finds its modules from its real path.
mkdir -p "$STAGE/usr/bin"
ln -s "../lib/$NAME/dist/src/bin/vmsr-helper.js" "$STAGE/usr/bin/vmsr-helper"
chmod 0755 "$LIB/dist/src/bin/vmsr-helper.js"

# 4. The units, as contrib/systemd has them, plus the default file's options. They go to
#    /etc/systemd/system, not /usr/lib: Debian's qemu-system-common ships units of the same names
#    there, which ours override (docs/packaging.md). Not conffiles: removing the package removes them.
UNITS="qemu-vmsr-helper.socket qemu-vmsr-helper.service vmsr-helper-exporter.service"
mkdir -p "$STAGE/etc/systemd/system" "$STAGE/etc/default"
for u in $UNITS; do
  case "$u" in
    qemu-vmsr-helper.service) var=VMSR_HELPER_OPTS ;;
    vmsr-helper-exporter.service) var=VMSR_EXPORTER_OPTS ;;
    *) var="" ;;
  esac
  if [ -n "$var" ]; then
    sed -e "s|^\[Service\]\$|[Service]\n# Options from the default file (package vmsr-helper)\nEnvironmentFile=-/etc/default/$NAME|" \
      -e "s|^ExecStart=\(.*\)\$|ExecStart=\1 \$$var|" "contrib/systemd/$u" > "$STAGE/etc/systemd/system/$u"
  else
    cp "contrib/systemd/$u" "$STAGE/etc/systemd/system/$u"
  fi
done
cp contrib/debian/default "$STAGE/etc/default/$NAME"

# 5. Control files and maintainer scripts.
mkdir -p "$STAGE/DEBIAN"
for s in postinst prerm postrm; do
  cp "contrib/debian/$s" "$STAGE/DEBIAN/$s"
  chmod 0755 "$STAGE/DEBIAN/$s"
done
echo "/etc/default/$NAME" > "$STAGE/DEBIAN/conffiles"
SIZE=$(du -sk --exclude=DEBIAN "$STAGE" | cut -f1)
sed -e "s|@VERSION@|$VERSION|" -e "s|@ARCH@|$ARCH|" -e "s|@SIZE@|$SIZE|" contrib/debian/control > "$STAGE/DEBIAN/control"

# Modes: directories 0755, files 0644 unless executable (the command, the maintainer scripts).
find "$STAGE" -type d -exec chmod 0755 {} +
find "$STAGE" -type f ! -perm -u+x -exec chmod 0644 {} +
find "$STAGE" -type f -perm -u+x -exec chmod 0755 {} +

mkdir -p "$OUT"
DEB=$OUT/${NAME}_${VERSION}_${ARCH}.deb
dpkg-deb --root-owner-group -Zxz --build "$STAGE" "$DEB" >/dev/null
echo "$DEB"
