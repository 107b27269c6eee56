#!/usr/bin/env bash
# The README's recipe end to end on the shipped English->French example system (Multi30k), each
# step as a user runs it, at the smallest budget that still learns (every model's validation
# perplexity falls well below the unigram's):
#   1. train the five models with bin/phrasescore-train-recipe, as many at once as there are
#      cores: the column's model on the distinct phrase pairs of the example system's table
#      (`train --phrase-table`, Cho et al. 2014 §3.1), and four sentence models on the example
#      corpus: attention left to right, right to left (--reverse-target), French->English, and a
#      deep LSTM (--arch lstm),
#   2. rescore a copy of examples/model (OUT/model/phrase-table.gz) with the column's model
#      (+1 column: p(target | source)) and write OUT/model/moses.rescored.ini,
#   3. score the n-best lists of the full Multi30k Moses system (examples/nbest: dev and test)
#      with the four sentence models, one `nbest` call per list (the two lists side by side),
#   4. with Moses ($MOSES_HOME: bin/extractor, bin/mert) tune the four features' weights on the
#      dev list (`rerank-tune`) and print the test BLEU before and after; without it print the
#      commands,
#   5. print what was produced and the next command (MERT).
# Everything is written under OUT (default build/example in the checkout); examples/ is only read.
# Usage: examples/run.sh [--quick | --long | --minutes M] [--sentences N] [--out OUT]
#   (default)      50 updates per model (a minute or less each; the same models on every
#                  machine), the first 100 sentences of each list (130 s with Moses on a quiet
#                  2-core machine, 313 s at load 3-5: docs/benchmarks.md, The example)
#   --long         at most 3 minutes of training per model and all 200 sentences (at most 9
#                  minutes of training on 2 cores: three rounds of two; a model stops sooner
#                  at its validation curve's plateau, as the recipe's do)
#   --minutes M    at most M minutes per model
#   --sentences N  re-rank the first N of the lists' 200 dev and 200 test sentences
#   --quick        30 updates per model, 50 sentences (the tests)
#   --out OUT      the output directory (default build/example).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
budget=(-- --max-steps 50)  # the recipe script's budget flags: minutes, or updates passed through
budget_text="50 updates"
sentences=100  # of the shipped lists' 200 dev and 200 test sentences
out="$root/build/example"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --quick) budget=(-- --max-steps 30); budget_text="30 updates"; sentences=50; shift ;;
    --long) budget=(--minutes 3 --); budget_text="3 minutes"; sentences=200; shift ;;
    --minutes) budget=(--minutes "$2" --); budget_text="$2 minutes"; shift 2 ;;
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
phrasescore() { python3 -m phrasescore "$@"; }
export PHRASESCORE="python3 -m phrasescore"  # for bin/ scripts

mkdir -p "$out/model"
out="$(cd "$out" && pwd)"
model_dir="$out/model"
nn="$out/nn"
nb="$out/rerank"
mkdir -p "$nb"
# the Moses system's files are copied, so that the rescored table and ini lie beside them
cp "$here/model/moses.ini" "$here/model/phrase-table.gz" "$model_dir/"
corpus="$here/corpus"
started=$(date +%s)
# the lists' sources and references: sentence ids 0 .. sentences-1
zcat "$corpus/val.tok.lc.en.gz" | sed -n "1,${sentences}p" > "$nb/dev.en"
zcat "$corpus/val.tok.lc.fr.gz" | sed -n "1,${sentences}p" > "$nb/dev.fr"
zcat "$corpus/test_2016_flickr.tok.lc.en.gz" | sed -n "1,${sentences}p" > "$nb/test.en"
zcat "$corpus/test_2016_flickr.tok.lc.fr.gz" | sed -n "1,${sentences}p" > "$nb/test.fr"
for set in dev test; do
  zcat "$here/nbest/$set.100best.nbest.gz" | awk -F' [|][|][|] ' -v n="$sentences" '$1 < n' \
    > "$nb/$set.100best.nbest"
done
# validation on val lines 201-500, which the dev lists do not hold
zcat "$corpus/val.tok.lc.en.gz" | tail -n +201 > "$nb/valid.en"
zcat "$corpus/val.tok.lc.fr.gz" | tail -n +201 > "$nb/valid.fr"

echo "== 1/4 training the five models ($budget_text each) with bin/phrasescore-train-recipe" >&2
"$root/bin/phrasescore-train-recipe" --corpus "$corpus/train.tok.lc" --valid "$nb/valid" \
  --f en --e fr --table "$model_dir/phrase-table.gz" -o "$nn" --force "${budget[@]}" \
  --valid-every 25 --seed 1 > "$nn.next-steps.txt"

echo "== 2/4 rescoring $model_dir/phrase-table.gz with the column's model" >&2
phrasescore rescore "$model_dir/phrase-table.gz" -m "$nn/column.safetensors" \
  -o "$model_dir/phrase-table.rescored.gz" --no-progress \
  --moses-ini "$model_dir/moses.ini" --ini-out "$model_dir/moses.rescored.ini"

echo "== 3/4 scoring the dev and test lists ($sentences sentences each) with the four sentence models" >&2
score_list() {  # SET: one nbest call, one feature per model
  phrasescore nbest "$nb/$1.100best.nbest" --source "$nb/$1.en" \
    -m L2R="$nn/l2r.safetensors" -m R2L="$nn/r2l.safetensors" -m LSTM="$nn/lstm.safetensors" \
    --inverse-model Inv="$nn/inverse.safetensors" --threads 1 -o "$nb/$1.scored.nbest" --no-progress
}
score_list dev & dev_scoring=$!
score_list test
wait "$dev_scoring"

# the Moses system's own 1-best (the lists' order under its tuned weights)
phrasescore nbest "$nb/test.100best.nbest" --source "$nb/test.en" \
  --weights "$here/nbest/tuned.ini" --one-best -o "$nb/test.moses.fr" --no-progress 2>/dev/null
bleu() { phrasescore evaluate "$1" "$nb/test.fr" --tokenize none | awk '/^BLEU =/ {print $3; exit}'; }
moses_bin="${MOSES_HOME:-}/bin"
if [[ -n "${MOSES_HOME:-}" && -x "$moses_bin/extractor" && -x "$moses_bin/mert" ]]; then
  echo "== 4/4 tuning the re-ranking weights on the dev list (rerank-tune: extractor, mert)" >&2
  phrasescore rerank-tune "$nb/dev.scored.nbest" --reference "$nb/dev.fr" \
    --start "$here/nbest/tuned.ini" --moses-home "$MOSES_HOME" -o "$nb/rerank.weights"
  phrasescore nbest "$nb/test.scored.nbest" --source "$nb/test.en" --weights "$nb/rerank.weights" \
    --one-best -o "$nb/test.reranked.fr" --no-progress 2>/dev/null
  # whose gain it is: with the four features' weights all 0, Moses' own features retuned
  neural_weights="$(awk '/^(L2R|R2L|LSTM|Inv)=/ {for (i = 2; i <= NF; i++) if ($i + 0 != 0) n++}
    END {print n + 0}' "$nb/rerank.weights")"
  if [[ $neural_weights -eq 0 ]]; then
    whose="the four features' weights are all 0: the gain is Moses' own features retuned on the
                 dev list, not the models' (train them longer than --quick)"
  else
    whose="Moses' own features are retuned with them: part of the gain is theirs"
  fi
  rerank_report="  test BLEU      Moses 1-best $(bleu "$nb/test.moses.fr")
                 re-ranked    $(bleu "$nb/test.reranked.fr")   (weights tuned on the dev list: $nb/rerank.weights;
                 the four features': $(grep -E '^(L2R|R2L|LSTM|Inv)=' "$nb/rerank.weights" | tr '\n' ' '))
                 $whose"
else
  echo "== 4/4 (no MOSES_HOME: the tuning commands are printed)" >&2
  rerank_report="  test BLEU      Moses 1-best $(bleu "$nb/test.moses.fr"); to tune the four features' weights and re-rank, set
                 MOSES_HOME to a Moses build and rerun, or run in $nb:
                   phrasescore rerank-tune dev.scored.nbest --reference dev.fr --start $here/nbest/tuned.ini \\
                       --moses-home \$MOSES -o rerank.weights
                   phrasescore nbest test.scored.nbest --source test.en --weights rerank.weights --one-best"
fi

lines_in=$(zcat "$model_dir/phrase-table.gz" | wc -l)
lines_out=$(zcat "$model_dir/phrase-table.rescored.gz" | wc -l)
cols_in=$(zcat "$model_dir/phrase-table.gz" | sed -n 1p | awk -F' [|][|][|] ' '{print split($3, a, " ")}')
cols_out=$(zcat "$model_dir/phrase-table.rescored.gz" | sed -n 1p | awk -F' [|][|][|] ' '{print split($3, a, " ")}')
seconds=$(( $(date +%s) - started ))
perplexities() {  # the validation perplexity of each model against its unigram's
  local name
  for name in column l2r r2l inverse lstm; do
    awk -F'\t' -v n="$name" '{sub("valid_ppl=", "", $2); sub("unigram_ppl=", "", $3); printf "%s %s (unigram %s)  ", n, $2, $3}' "$nn/$name.result"
  done
}

cat <<REPORT

phrasescore example: done in ${seconds} s
  models         $nn/{column,l2r,r2l,inverse,lstm}.safetensors, each with its .log and
                 .curve.png; validation perplexity:
                 $(perplexities)
  phrase table   $model_dir/phrase-table.rescored.gz
                 $lines_out lines (input $lines_in), $cols_out scores per line (input $cols_in):
                 the last column is p(target | source) from the column's model
  moses.ini      $model_dir/moses.rescored.ini (TranslationModel0 now declares $cols_out features)
  first line     $(zcat "$model_dir/phrase-table.rescored.gz" | sed -n 1p)
  re-ranking     $nb/{dev,test}.scored.nbest: the lists with L2R=, R2L=, LSTM= and Inv= added
$rerank_report

next: tune the new weight with MERT (Moses installed in \$MOSES, dev set tokenised and lowercased):
  rm -rf mert-work/features.list mert-work/filtered   # stale from an earlier run
  \$MOSES/scripts/training/mert-moses.pl dev.en dev.fr \$MOSES/bin/moses \\
      $model_dir/moses.rescored.ini --mertdir \$MOSES/bin --working-dir mert-work \\
      --decoder-flags "-threads 2"
REPORT
