#!/usr/bin/env bash
# Fetches the embedded default's corpus: six Jane Austen novels (public domain) as packaged by
# Debian's r-cran-janeaustenr, whose janeaustenr/data/Rdata.rdb titan reads directly (R's
# serialized character vectors, data/rdata.c). No R is needed: apt-get download + dpkg -x.
#   scripts/fetch_austen.sh OUT.rdb
set -euo pipefail
out=$1
[ -f "$out" ] && exit 0
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && apt-get download -qq r-cran-janeaustenr 2>/dev/null) || {
  apt-get update -qq && (cd "$work" && apt-get download -qq r-cran-janeaustenr)
}
dpkg -x "$work"/r-cran-janeaustenr_*.deb "$work/pkg"
mkdir -p "$(dirname "$out")"
cp "$(find "$work/pkg" -path '*janeaustenr/data/Rdata.rdb')" "$out"
echo "fetch: $out ($(stat -c %s "$out") bytes, from r-cran-janeaustenr)"
