#!/usr/bin/env bash
# The main job end to end on the shipped English->French example system (Multi30k):
#   1. train the default model on the distinct phrase pairs of the example system's table
#      (`train --phrase-table`, Cho et al. 2014 §3.1: the recipe the README recommends),
#   2. rescore a copy of examples/model (OUT/model/phrase-table.gz) with it (+1 column:
#      p(target | source)),
#   3. write OUT/model/moses.rescored.ini (one more feature and weight),
#   4. re-rank n-best lists of the full Multi30k Moses system (examples/nbest: 200 dev and 200
#      test sentences) with four sentence models trained on the example corpus: three attention
#      models, left to right, right to left (--reverse-target) and French->English (nbest
#      --inverse), and a deep LSTM (--arch lstm, left to right), one feature each;
#      with Moses ($MOSES_HOME: bin/extractor, bin/mert) their weights are tuned on the dev lists
#      and the test BLEU before/after is printed, without it the tuning commands are,
#   5. print what was produced and the next command (MERT).
# Everything is written under OUT (default build/example in the checkout); examples/ is only read.
# Usage: examples/run.sh [--quick] [--minutes M] [--out OUT]
#   --quick    60 updates of the column's model, 30 per re-ranking model and 50 sentences of
#              the lists (CI); the default trains the column's model for 4 minutes (--minutes M:
#              M) and each re-ranking model for 2, and re-ranks all 200.
#   --out OUT  the output directory (default build/example).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
column_budget=(--max-minutes 4)
rerank_budget=(--max-minutes 2)
sentences=200  # of the shipped lists' 200 dev and 200 test sentences
out="$(dirname "$here")/build/example"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --quick) column_budget=(--max-steps 60); rerank_budget=(--max-steps 30); sentences=50; shift ;;
    --minutes) column_budget=(--max-minutes "$2"); shift 2 ;;
    --out) out="$2"; shift 2 ;;
    -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "error: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done

export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
if ! python3 -c "import phrasescore" 2>/dev/null; then
  echo "phrasescore is not installed: installing it from $(dirname "$here")" >&2
  make -C "$(dirname "$here")" install
fi
phrasescore() { python3 -m phrasescore "$@"; }

mkdir -p "$out/model"
out="$(cd "$out" && pwd)"
model_dir="$out/model"
# the Moses system's files are copied, so that the rescored table and ini lie beside them
cp "$here/model/moses.ini" "$here/model/phrase-table.gz" "$model_dir/"
started=$(date +%s)

echo "== 1/3 training the default model (${column_budget[*]}) on the phrase pairs of $(zcat "$model_dir/phrase-table.gz" | wc -l) table lines" >&2
phrasescore train --phrase-table "$model_dir/phrase-table.gz" \
  --src-lang en --tgt-lang fr --valid-every 100 "${column_budget[@]}" --seed 1 \
  -o "$out/en-fr.safetensors" > "$out/train.result"

echo "== 2/3 rescoring $model_dir/phrase-table.gz" >&2
phrasescore rescore "$model_dir/phrase-table.gz" -m "$out/en-fr.safetensors" \
  -o "$model_dir/phrase-table.rescored.gz" \
  --moses-ini "$model_dir/moses.ini" --ini-out "$model_dir/moses.rescored.ini"

echo "== 3/3 re-ranking n-best lists with four sentence models (L2R, R2L, LSTM, inverse)" >&2
nb="$out/rerank"
mkdir -p "$nb"
corpus="$here/corpus"
zcat "$corpus/val.tok.lc.en.gz" | sed -n "1,${sentences}p" > "$nb/dev.en"
zcat "$corpus/val.tok.lc.fr.gz" | sed -n "1,${sentences}p" > "$nb/dev.fr"
zcat "$corpus/test_2016_flickr.tok.lc.en.gz" | sed -n "1,${sentences}p" > "$nb/test.en"
zcat "$corpus/test_2016_flickr.tok.lc.fr.gz" | sed -n "1,${sentences}p" > "$nb/test.fr"
for set in dev test; do  # the hypotheses of sentence ids 0 .. sentences-1
  zcat "$here/nbest/$set.100best.nbest.gz" | awk -F' [|][|][|] ' -v n="$sentences" '$1 < n' \
    > "$nb/$set.100best.nbest"
done
# validation on val lines 201-500, which the dev lists do not hold
zcat "$corpus/val.tok.lc.en.gz" | tail -n +201 > "$nb/valid.en"
zcat "$corpus/val.tok.lc.fr.gz" | tail -n +201 > "$nb/valid.fr"
rerank_train() {  # OUTPUT ARCH SRC TGT [flags]: a sentence model on the example corpus
  local output="$1" arch="$2" src="$3" tgt="$4"; shift 4
  phrasescore train "$corpus/train.tok.lc.$src.gz" "$corpus/train.tok.lc.$tgt.gz" \
    --src-lang "$src" --tgt-lang "$tgt" --arch "$arch" --valid "$nb/valid.$src" "$nb/valid.$tgt" \
    "${rerank_budget[@]}" --valid-every 100 --seed 1 -o "$output" "$@" > "$output.result"
}
rerank_train "$nb/l2r.safetensors" attention en fr
rerank_train "$nb/r2l.safetensors" attention en fr --reverse-target
rerank_train "$nb/lstm.safetensors" lstm en fr
rerank_train "$nb/fr-en.safetensors" attention fr en
# one feature per model ("MODEL NAME [flags]"), each nbest call on the list the previous one wrote:
# SET.1.nbest, SET.2.nbest, ..., the last SET.scored.nbest
features=("l2r L2R" "r2l R2L" "lstm LSTM" "fr-en Inv --inverse")
for set in dev test; do
  list="$nb/$set.100best.nbest"
  for k in "${!features[@]}"; do
    read -r model name flags <<< "${features[$k]}"
    scored="$nb/$set.$((k + 1)).nbest"
    (( k + 1 < ${#features[@]} )) || scored="$nb/$set.scored.nbest"
    # shellcheck disable=SC2086  # $flags: no word or several
    phrasescore nbest "$list" --source "$nb/$set.en" -m "$nb/$model.safetensors" --name "$name" \
      $flags -o "$scored" --no-progress
    list="$scored"
  done
done
# the Moses system's own 1-best (the lists' order under its tuned weights)
phrasescore nbest "$nb/test.100best.nbest" --source "$nb/test.en" \
  --weights "$here/nbest/tuned.ini" --one-best -o "$nb/test.moses.fr" --no-progress 2>/dev/null
bleu() { phrasescore evaluate "$1" "$nb/test.fr" --tokenize none | awk '/^BLEU =/ {print $3; exit}'; }
moses_bin="${MOSES_HOME:-}/bin"
if [[ -n "${MOSES_HOME:-}" && -x "$moses_bin/extractor" && -x "$moses_bin/mert" ]]; then
  (
    cd "$nb"
    "$moses_bin/extractor" --sctype BLEU --scconfig case:true -r dev.fr -n dev.scored.nbest \
      --scfile scores.dat --ffile features.dat 2> extractor.log
    phrasescore rerank-weights features.dat --start "$here/nbest/tuned.ini" -o init.opt 2>/dev/null
    "$moses_bin/mert" -d "$(head -1 features.dat | cut -d' ' -f4)" --sctype BLEU \
      --scconfig case:true -n 20 -r 1234 --scfile scores.dat --ffile features.dat \
      --ifile init.opt 2> mert.log
    phrasescore rerank-weights features.dat --tuned weights.txt -o rerank.weights 2>/dev/null
  )
  phrasescore nbest "$nb/test.scored.nbest" --source "$nb/test.en" --weights "$nb/rerank.weights" \
    --one-best -o "$nb/test.reranked.fr" --no-progress 2>/dev/null
  rerank_report="  test BLEU      Moses 1-best $(bleu "$nb/test.moses.fr")
                 re-ranked    $(bleu "$nb/test.reranked.fr")   (weights tuned by mert on the dev lists: $nb/rerank.weights)"
else
  rerank_report="  test BLEU      Moses 1-best $(bleu "$nb/test.moses.fr"); to tune the four features' weights and re-rank, set
                 MOSES_HOME to a Moses build and rerun, or follow docs/moses.md (re-ranking by hand) in $nb"
fi

lines_in=$(zcat "$model_dir/phrase-table.gz" | wc -l)
lines_out=$(zcat "$model_dir/phrase-table.rescored.gz" | wc -l)
cols_in=$(zcat "$model_dir/phrase-table.gz" | sed -n 1p | awk -F' [|][|][|] ' '{print split($3, a, " ")}')
cols_out=$(zcat "$model_dir/phrase-table.rescored.gz" | sed -n 1p | awk -F' [|][|][|] ' '{print split($3, a, " ")}')
seconds=$(( $(date +%s) - started ))
valid_ppl=$(cut -f2 "$out/train.result")

cat <<REPORT

phrasescore example: done in ${seconds} s
  model          $out/en-fr.safetensors ($valid_ppl; training log $out/en-fr.safetensors.log,
                 curve $out/en-fr.safetensors.curve.png)
  phrase table   $model_dir/phrase-table.rescored.gz
                 $lines_out lines (input $lines_in), $cols_out scores per line (input $cols_in):
                 the last column is p(target | source) from the model
  moses.ini      $model_dir/moses.rescored.ini (TranslationModel0 now declares $cols_out features)
  first line     $(zcat "$model_dir/phrase-table.rescored.gz" | sed -n 1p)
  re-ranking     $nb/{dev,test}.scored.nbest: the lists with L2R=, R2L=, LSTM= and Inv= added
                 (models $nb/l2r.safetensors, r2l.safetensors, lstm.safetensors, fr-en.safetensors)
$rerank_report

next: tune the new weight with MERT (Moses installed in \$MOSES, dev set tokenised and lowercased):
  rm -rf mert-work/features.list mert-work/filtered   # stale from an earlier run
  \$MOSES/scripts/training/mert-moses.pl dev.en dev.fr \$MOSES/bin/moses \\
      $model_dir/moses.rescored.ini --mertdir \$MOSES/bin --working-dir mert-work \\
      --decoder-flags "-threads 2"
REPORT
