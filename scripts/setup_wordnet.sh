#!/usr/bin/env bash
# Install WordNet 3.0 for METEOR's synonym stage, offline, into the project's NLTK data folder.
#
#   sudo scripts/setup_wordnet.sh                 # -> .venv/nltk_data/corpora/wordnet/
#   NLTK_DATA_DIR=/opt/nltk_data scripts/setup_wordnet.sh
#
# Debian's `wordnet-base` + `wordnet-sense-index` ship the WordNet 3.0 database under
# /usr/share/wordnet. nltk only reads corpora from its own data path, so the files are copied into
# <NLTK_DATA_DIR>/corpora/wordnet/, together with the `lexnames` table nltk needs and Debian lacks.
# memreader.eval.metrics adds .venv/nltk_data to nltk.data.path. Safe to run again: it only fills in what is
# missing and rewrites the copies.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="${NLTK_DATA_DIR:-$ROOT/.venv/nltk_data}/corpora/wordnet"
SRC="${WORDNET_SRC:-/usr/share/wordnet}"
PACKAGES=(wordnet-base wordnet-sense-index)

have_source() {
  [[ -f "$SRC/data.noun" && -f "$SRC/index.noun" && -f "$SRC/index.sense" && -f "$SRC/verb.exc" ]]
}

if ! have_source; then
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "setup_wordnet: $SRC has no WordNet files and apt-get is unavailable;" \
         "install WordNet 3.0 there (or set WORDNET_SRC) and rerun." >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  # Package lists may be empty in fresh containers: refresh once, only when the install fails.
  if ! apt-get install -y --no-install-recommends "${PACKAGES[@]}"; then
    apt-get update
    apt-get install -y --no-install-recommends "${PACKAGES[@]}"
  fi
fi
have_source || { echo "setup_wordnet: WordNet files still missing under $SRC" >&2; exit 1; }

mkdir -p "$DEST"
count=0
for file in "$SRC"/data.* "$SRC"/index.* "$SRC"/*.exc; do
  [[ -f "$file" ]] || continue
  cp -f "$file" "$DEST/"
  count=$((count + 1))
done

# The 45 lexicographer files of WordNet 3.0, numbered as in its lexnames(5WN) page.
cat > "$DEST/lexnames" <<'EOF'
00	adj.all	3
01	adj.pert	3
02	adv.all	4
03	noun.Tops	1
04	noun.act	1
05	noun.animal	1
06	noun.artifact	1
07	noun.attribute	1
08	noun.body	1
09	noun.cognition	1
10	noun.communication	1
11	noun.event	1
12	noun.feeling	1
13	noun.food	1
14	noun.group	1
15	noun.location	1
16	noun.motive	1
17	noun.object	1
18	noun.person	1
19	noun.phenomenon	1
20	noun.plant	1
21	noun.possession	1
22	noun.process	1
23	noun.quantity	1
24	noun.relation	1
25	noun.shape	1
26	noun.state	1
27	noun.substance	1
28	noun.time	1
29	verb.body	2
30	verb.change	2
31	verb.cognition	2
32	verb.communication	2
33	verb.competition	2
34	verb.consumption	2
35	verb.contact	2
36	verb.creation	2
37	verb.emotion	2
38	verb.motion	2
39	verb.perception	2
40	verb.possession	2
41	verb.social	2
42	verb.stative	2
43	verb.weather	2
44	adj.ppl	3
EOF

echo "setup_wordnet: copied $count files and wrote lexnames into $DEST"
