#!/usr/bin/env bash
# The main job end to end on the shipped English->French example system (Multi30k):
#   1. train the default model on the distinct phrase pairs of the example system's table
#      (`train --phrase-table`, Cho et al. 2014 §3.1: the recipe the README recommends),
#   2. rescore a copy of examples/model (OUT/model/phrase-table.gz) with it (+1 column:
#      p(target | source)),
#   3. write OUT/model/moses.rescored.ini (one more feature and weight),
#   4. print what was produced and the next command (MERT).
# Everything is written under OUT (default build/example in the checkout); examples/ is only read.
# Usage: examples/run.sh [--quick] [--minutes M] [--out OUT]
#   --quick    about 1 minute of training (CI); the default trains for 4 minutes.
#   --out OUT  the output directory (default build/example).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
minutes=4
out="$(dirname "$here")/build/example"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --quick) minutes=1; shift ;;
    --minutes) minutes="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    -h|--help) sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
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

echo "== 1/2 training the default model for up to $minutes minute(s) on the phrase pairs of $(zcat "$model_dir/phrase-table.gz" | wc -l) table lines" >&2
phrasescore train --phrase-table "$model_dir/phrase-table.gz" \
  --src-lang en --tgt-lang fr --max-minutes "$minutes" --valid-every 100 --seed 1 \
  -o "$out/en-fr.safetensors" > "$out/train.result"

echo "== 2/2 rescoring $model_dir/phrase-table.gz" >&2
phrasescore rescore "$model_dir/phrase-table.gz" -m "$out/en-fr.safetensors" \
  -o "$model_dir/phrase-table.rescored.gz" \
  --moses-ini "$model_dir/moses.ini" --ini-out "$model_dir/moses.rescored.ini"

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

next: tune the new weight with MERT (Moses installed in \$MOSES, dev set tokenised and lowercased):
  rm -rf mert-work/features.list mert-work/filtered   # stale from an earlier run
  \$MOSES/scripts/training/mert-moses.pl dev.en dev.fr \$MOSES/bin/moses \\
      $model_dir/moses.rescored.ini --mertdir \$MOSES/bin --working-dir mert-work \\
      --decoder-flags "-threads 2"
REPORT
