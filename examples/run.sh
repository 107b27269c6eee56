#!/usr/bin/env bash
# The README's recipe, `phrasescore recipe`, on the shipped English->French example system
# (Multi30k: examples/model's 49,446-line table, examples/corpus), at the smallest budget that
# still learns (every model's validation perplexity falls well below the unigram's):
#   1. the example system made runnable under OUT/system: the first N sentences of val (dev) and
#      test_2016_flickr (test), val lines 201-500 (the models' validation set), and with Moses
#      ($MOSES_HOME) a 5-gram KenLM built by its lmplz from the example corpus and a moses.ini
#      with absolute paths (the shipped ini's lexical reordering table is not shipped),
#   2. phrasescore recipe (its work folder: OUT/recipe): the five models (two at a time on 2 cores), the column, and with Moses
#      MERT, the tuned system's 50-best lists, their four features, the re-ranking weights and
#      the test BLEU before and after; without Moses those steps are reported as skipped. The
#      re-ranking tunes the four models' weights only (--tune new): on 100 dev sentences,
#      retuning every weight on the fixed lists overfits them (docs/benchmarks.md, The example).
# Run again, it redoes nothing (each step is up to date); killed, it resumes where it stopped.
# Everything is written under OUT (default build/example in the checkout); examples/ is only read.
# Usage: examples/run.sh [--quick | --long | --minutes M] [--sentences N] [--out OUT]
#   (default)      50 updates per model, the first 100 sentences of dev and test, MERT 3
#                  iterations, 50-best lists (docs/benchmarks.md, The example)
#   --long         at most 3 minutes of training per model (a model stops sooner at its
#                  validation curve's plateau, as the recipe's do), all 200 sentences, MERT
#                  to its own end, the recipe's 100-best lists
#   --minutes M    at most M minutes per model
#   --sentences N  dev and test: the first N of 1 to 200 sentences
#   --quick        30 updates per model of the tiny preset (the pipeline, not the models'
#                  quality), 50 sentences, MERT 2 iterations (the tests)
#   --out OUT      the output directory (default build/example).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
budget=(-- --max-steps 50)  # the recipe's budget flags: minutes, or updates passed to train
mert=(--mert-iterations 3)
nbest=(--nbest-size 50)  # on 100 dev sentences as good as 100-best, at half the scoring
sentences=100
out="$root/build/example"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --quick) budget=(-- --max-steps 30 --preset tiny); mert=(--mert-iterations 2); sentences=50; shift ;;
    --long) budget=(--minutes 3 --); mert=(); nbest=(); sentences=200; shift ;;
    --minutes) budget=(--minutes "$2" --); shift 2 ;;
    --sentences) sentences="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    -h|--help) awk 'NR > 1 && !/^#/ {exit} NR > 1' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "error: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
[[ $sentences =~ ^[0-9]+$ && $sentences -ge 1 && $sentences -le 200 ]] ||
  { echo "error: --sentences $sentences: give 1 to 200" >&2; exit 2; }

export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
if ! python3 -c "import phrasescore" 2>/dev/null; then
  echo "phrasescore is not installed: installing it from $root" >&2
  make -C "$root" install
fi

mkdir -p "$out/system"
out="$(cd "$out" && pwd)"
system="$out/system"  # the example system, made runnable
work="$out/recipe"    # the recipe's work folder
corpus="$here/corpus"
started=$(date +%s)
# Written only when their content changes, so that a second run finds every step up to date.
put() {  # FILE: standard input into FILE unless FILE holds it already
  local tmp="$1.new"
  cat > "$tmp"
  if cmp -s "$tmp" "$1"; then rm -f "$tmp"; else mv "$tmp" "$1"; fi
}
for lang in en fr; do
  zcat "$corpus/val.tok.lc.$lang.gz" | sed -n "1,${sentences}p" | put "$system/dev.$lang"
  zcat "$corpus/test_2016_flickr.tok.lc.$lang.gz" | sed -n "1,${sentences}p" | put "$system/test.$lang"
  zcat "$corpus/val.tok.lc.$lang.gz" | tail -n +201 | put "$system/valid.$lang"  # not in dev
done
lm=""
moses_home="${MOSES_HOME:-${MOSES:-}}"
if [[ -n $moses_home ]]; then
  if [[ ! -f $system/lm.fr.blm ]]; then
    echo "== the example system's 5-gram KenLM (lmplz, build_binary)" >&2
    zcat "$corpus/train.tok.lc.fr.gz" |
      "$moses_home/bin/lmplz" -o 5 -S 10% -T "$system" > "$system/lm.fr.arpa" 2> "$system/lm.log"
    "$moses_home/bin/build_binary" "$system/lm.fr.arpa" "$system/lm.fr.blm.new" >> "$system/lm.log"
    mv "$system/lm.fr.blm.new" "$system/lm.fr.blm"
    rm -f "$system/lm.fr.arpa"
  fi
  lm="KENLM name=LM0 factor=0 path=$system/lm.fr.blm order=5"
fi
# the shipped moses.ini with absolute paths, without the lexical reordering table (not shipped)
sed -e "s#path=phrase-table.gz#path=$here/model/phrase-table.gz#" -e '/^LexicalReordering/d' \
    -e '/^LexicalReordering0=/d' -e "s#^KENLM .*#$lm#" "$here/model/moses.ini" |
  { if [[ -n $lm ]]; then cat; else grep -v '^LM0='; fi; } | put "$system/moses.ini"

echo "== phrasescore recipe on the example system ($sentences dev and test sentences)" >&2
python3 -m phrasescore recipe --moses-ini "$system/moses.ini" --corpus "$corpus/train.tok.lc" \
  --valid "$system/valid" --dev "$system/dev" --test "$system/test" --f en --e fr -o "$work" \
  --tune new ${mert[@]+"${mert[@]}"} ${nbest[@]+"${nbest[@]}"} "${budget[@]}" --valid-every 25 --seed 1 | tee "$out/recipe.txt"

perplexities() {  # the validation perplexity of each model against its unigram's
  local name
  for name in column l2r r2l inverse lstm; do
    awk -F'\t' -v n="$name" '{sub("valid_ppl=", "", $2); sub("unigram_ppl=", "", $3); printf "%s %s (unigram %s)  ", n, $2, $3}' "$work/nn/$name.result"
  done
}
cat <<REPORT

phrasescore example: done in $(( $(date +%s) - started )) s
  models         $work/nn/{column,l2r,r2l,inverse,lstm}.safetensors, each with its .log and
                 .curve.png; validation perplexity:
                 $(perplexities)
  phrase table   $work/model/phrase-table.rescored.gz (+1 column: p(target | source)) and
                 $work/model/moses.rescored.ini
  first line     $(zcat "$work/model/phrase-table.rescored.gz" | sed -n 1p)
  steps          each step's log and stamp in $work/logs (progress: recipe.log)
REPORT
if [[ -f $work/results.txt ]]; then
  echo "  results        $work/results.txt (tuned weights: $work/mert/moses.ini, $work/rerank.weights)"
else
  echo "  Moses steps    skipped: set MOSES_HOME to a Moses build and run again (the models and the"
  echo "                 table are kept: the recipe goes on from them)"
fi
