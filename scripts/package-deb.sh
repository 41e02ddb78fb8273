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
for tool in npm dpkg-deb dpkg dpkg-parsechangelog objdump gzip; do
  command -v "$tool" >/dev/null || { echo "cannot build the .deb: $tool is not installed; install it (apt-get install dpkg-dev binutils npm)" >&2; exit 1; }
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
# What a Debian system does not want from the modules: npm's and git's control files, a dependency's
# HTML page that loads scripts from CDNs, koffi's musl build (this is a glibc system) and its build tool.
find "$LIB/node_modules" \( -name .npmignore -o -name .gitattributes -o -name .gitignore -o -name '*.html' \) -type f -delete
find "$LIB/node_modules" -type d -name 'musl_*' -prune -exec rm -rf {} +
# The modules' own tests, benchmarks, examples and CI files (at each module's top), TypeScript
# declarations and source maps: nothing the program runs (about 300 test files otherwise).
for m in "$LIB"/node_modules/[!@.]* "$LIB"/node_modules/@*/*; do
  for d in test tests __tests__ benchmarks bench examples example .github; do rm -rf "${m:?}/$d"; done
done
find "$LIB/node_modules" -type f \( -name '*.ts' -o -name '*.mts' -o -name '*.cts' -o -name '*.map' \) -delete
find "$LIB/node_modules" -type d -empty -delete
# koffi's install script (it builds from source when no prebuilt part fits; never run, --ignore-scripts).
rm -f "$LIB/node_modules/koffi/cnoke.cjs"
# The maintainer scripts run from DEBIAN/ only; the Debian files are not the program's.
rm -rf "$LIB/contrib/debian"
# The documentation goes to /usr/share/doc, the man page and the completion where man and bash look.
DOC=$STAGE/usr/share/doc/$NAME
mkdir -p "$DOC" "$STAGE/usr/share/man/man1" "$STAGE/usr/share/bash-completion/completions"
mv "$LIB/docs" "$LIB/README.md" "$DOC/"
rm "$LIB/LICENSE"
gzip -9n < contrib/debian/changelog > "$DOC/changelog.gz"
gzip -9n < "$LIB/dist/share/man/man1/$NAME.1" > "$STAGE/usr/share/man/man1/$NAME.1.gz"
cp "$LIB/dist/share/bash-completion/completions/$NAME" "$STAGE/usr/share/bash-completion/completions/$NAME"
rm -rf "$LIB/dist/share"
mkdir -p "$STAGE/usr/share/lintian/overrides"
cp contrib/debian/lintian-overrides "$STAGE/usr/share/lintian/overrides/$NAME"
# The machine-readable copyright file: ours, then one paragraph per module from its package.json.
{
  cat contrib/debian/copyright
  ( cd "$LIB/node_modules" && node -e '
    const fs = require("fs"); const path = require("path");
    const dirs = fs.readdirSync(".").flatMap((d) => (d.startsWith("@") ? fs.readdirSync(d).map((s) => path.join(d, s)) : [d]));
    const spdx = { "MIT": "Expat", "ISC": "ISC", "Apache-2.0": "Apache-2.0" };
    const used = new Set();
    for (const d of dirs.filter((d) => fs.existsSync(path.join(d, "package.json"))).sort()) {
      const p = JSON.parse(fs.readFileSync(path.join(d, "package.json"), "utf8"));
      const l = spdx[p.license];
      if (!l) { console.error(`cannot build the .deb: module ${d} has license ${p.license}, not one copyright knows; add it to scripts/package-deb.sh`); process.exit(1); }
      used.add(l);
      console.log(`\nFiles: usr/lib/vmsr-helper/node_modules/${d}/*\nCopyright: the authors of ${p.name} (its LICENSE file)\nLicense: ${l}`);
    }
    const text = {
      Expat: " Permission is hereby granted, free of charge, to any person obtaining a copy of this software and associated documentation files (the \"Software\"), to deal in the Software without restriction, including without limitation the rights to use, copy, modify, merge, publish, distribute, sublicense, and/or sell copies of the Software, and to permit persons to whom the Software is furnished to do so, subject to the following conditions:\n .\n The above copyright notice and this permission notice shall be included in all copies or substantial portions of the Software.\n .\n THE SOFTWARE IS PROVIDED \"AS IS\", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY, FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM, OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE SOFTWARE.",
      ISC: " Permission to use, copy, modify, and/or distribute this software for any purpose with or without fee is hereby granted, provided that the above copyright notice and this permission notice appear in all copies.\n .\n THE SOFTWARE IS PROVIDED \"AS IS\" AND THE AUTHOR DISCLAIMS ALL WARRANTIES WITH REGARD TO THIS SOFTWARE INCLUDING ALL IMPLIED WARRANTIES OF MERCHANTABILITY AND FITNESS. IN NO EVENT SHALL THE AUTHOR BE LIABLE FOR ANY SPECIAL, DIRECT, INDIRECT, OR CONSEQUENTIAL DAMAGES OR ANY DAMAGES WHATSOEVER RESULTING FROM LOSS OF USE, DATA OR PROFITS, WHETHER IN AN ACTION OF CONTRACT, NEGLIGENCE OR OTHER TORTIOUS ACTION, ARISING OUT OF OR IN CONNECTION WITH THE USE OR PERFORMANCE OF THIS SOFTWARE.",
      "Apache-2.0": " On Debian systems, the full text of the Apache License version 2.0 is in /usr/share/common-licenses/Apache-2.0.",
    };
    for (const l of [...used].sort()) console.log(`\nLicense: ${l}\n${text[l]}`);
  ' )
} > "$DOC/copyright"

# 3. The command: a relative link, as npm makes, so the script finds its modules from its real path.
mkdir -p "$STAGE/usr/bin"
ln -s "../lib/$NAME/dist/src/bin/vmsr-helper.js" "$STAGE/usr/bin/vmsr-helper"
chmod 0755 "$LIB/dist/src/bin/vmsr-helper.js"

# 4. The units, as contrib/systemd has them, plus the default file's options, in /usr/lib/systemd/system
#    where Debian wants them. QEMU's own units of the same names (qemu-system-common) are diverted aside
#    by preinst (docs/packaging.md). /etc/default/vmsr-helper is the conffile that changes them.
UNITS="qemu-vmsr-helper.socket qemu-vmsr-helper.service vmsr-helper-exporter.service"
UNITDIR=$STAGE/usr/lib/systemd/system
mkdir -p "$UNITDIR" "$STAGE/etc/default"
for u in $UNITS; do
  case "$u" in
    qemu-vmsr-helper.service) var=VMSR_HELPER_OPTS ;;
    vmsr-helper-exporter.service) var=VMSR_EXPORTER_OPTS ;;
    *) var="" ;;
  esac
  if [ -n "$var" ]; then
    sed -e "s|^\[Service\]\$|[Service]\n# Options from the default file (package vmsr-helper)\nEnvironmentFile=-/etc/default/$NAME|" \
      -e "s|^ExecStart=\(.*\)\$|ExecStart=\1 \$$var|" "contrib/systemd/$u" > "$UNITDIR/$u"
  else
    cp "contrib/systemd/$u" "$UNITDIR/$u"
  fi
done
cp contrib/debian/default "$STAGE/etc/default/$NAME"

# 5. Control files and maintainer scripts. The maintainer comes from the changelog (one place).
mkdir -p "$STAGE/DEBIAN"
for s in preinst postinst prerm postrm; do
  cp "contrib/debian/$s" "$STAGE/DEBIAN/$s"
  chmod 0755 "$STAGE/DEBIAN/$s"
done
echo "/etc/default/$NAME" > "$STAGE/DEBIAN/conffiles"
CHANGELOG_VERSION=$(dpkg-parsechangelog -l contrib/debian/changelog -SVersion)
[ "$CHANGELOG_VERSION" = "$VERSION" ] || {
  echo "cannot build the .deb: contrib/debian/changelog's last version is $CHANGELOG_VERSION, package.json's $VERSION; add an entry (dch -v $VERSION)" >&2
  exit 1
}
MAINTAINER=$(dpkg-parsechangelog -l contrib/debian/changelog -SMaintainer)
# The newest glibc symbol version koffi's native part needs.
GLIBC=$(find "$LIB/node_modules" -name '*.node' -exec objdump -T {} + | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -V | tail -n 1)
SIZE=$(du -sk --exclude=DEBIAN "$STAGE" | cut -f1)
sed -e "s|@VERSION@|$VERSION|" -e "s|@ARCH@|$ARCH|" -e "s|@SIZE@|$SIZE|" -e "s|@MAINTAINER@|$MAINTAINER|" -e "s|@GLIBC@|$GLIBC|" \
  contrib/debian/control > "$STAGE/DEBIAN/control"

# Modes: directories 0755, files 0644 unless executable (the command, the maintainer scripts); native
# modules are shared libraries, 0644.
find "$STAGE" -type d -exec chmod 0755 {} +
find "$STAGE" -type f ! -perm -u+x -exec chmod 0644 {} +
find "$STAGE" -type f -perm -u+x -exec chmod 0755 {} +
find "$STAGE" -type f -name '*.node' -exec chmod 0644 {} +
# Dates: npm pack stamps every file 1985-10-26; the package's files take the changelog's date.
SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(dpkg-parsechangelog -l contrib/debian/changelog -STimestamp)}
find "$STAGE" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +

mkdir -p "$OUT"
DEB=$OUT/${NAME}_${VERSION}_${ARCH}.deb
dpkg-deb --root-owner-group -Zxz --build "$STAGE" "$DEB" >/dev/null
echo "$DEB"
