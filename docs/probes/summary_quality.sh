#!/usr/bin/env bash
# ROUGE and diversity of a summarizer's greedy (or beam) summaries of one split.
#   bash docs/probes/summary_quality.sh DATA CHECKPOINT SPLIT OUT [fairseq-generate options...]
# e.g. bash docs/probes/summary_quality.sh data-bin/samsum verifier.pt valid /tmp/valid \
#        --beam 1 --max-len-b 60 --min-len 10 --no-repeat-ngram-size 3
# Writes OUT.hyp (one summary a line, in input order) and prints cmasd-rouge's ROUGE F1
# against DATA/raw/SPLIT.refs.jsonl, how many distinct summaries there are, and the mean
# length in words of summaries and references, and how often a summary's first word (in
# SAMSum usually a speaker's name) occurs in its own dialogue, against the next dialogue's (a
# summarizer that does not read its dialogue scores about the same on both).
set -euo pipefail
DATA="$1" CKPT="$2" SPLIT="$3" OUT="$4"
shift 4
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
fairseq-generate "$DATA" --user-dir "$ROOT/fairseq_plugins" --task translation_speculative \
  --path "$CKPT" --gen-subset "$SPLIT" --batch-size 64 --remove-bpe sentencepiece --cpu "$@" \
  > "$OUT.generate" 2> "$OUT.log" || { echo "fairseq-generate failed: see $OUT.log" >&2; exit 1; }
grep '^H-' "$OUT.generate" | sed 's/^H-//' | sort -n -k1,1 | cut -f3 > "$OUT.hyp"
echo "summaries: $(wc -l < "$OUT.hyp"), distinct: $(sort -u "$OUT.hyp" | wc -l)"
awk '{ n += NF } END { printf "mean words: summaries %.1f, ", n / NR }' "$OUT.hyp"
awk '{ n += NF } END { printf "references %.1f\n", n / NR }' "$DATA/raw/$SPLIT.tgt"
cmasd-rouge "$OUT.hyp" "$DATA/raw/$SPLIT.refs.jsonl"
python - "$OUT.hyp" "$DATA/raw/$SPLIT.src" "$DATA/raw/$SPLIT.tgt" <<'PYEOF'
import re, sys
def first_word_found(summaries, sources, shift):
    found = total = 0
    for i, summary in enumerate(summaries):
        words = re.findall(r"\w+", summary)
        if not words:
            continue
        total += 1
        found += words[0] in re.findall(r"\w+", sources[(i + shift) % len(sources)])
    return 100.0 * found / max(total, 1)
summaries, sources, references = (open(path, encoding="utf-8").read().splitlines() for path in sys.argv[1:])
for name, texts in (("summaries", summaries), ("references", references)):
    print(f"{name}: first word in own dialogue {first_word_found(texts, sources, 0):.1f}%, "
          f"in the next one {first_word_found(texts, sources, 1):.1f}%")
PYEOF
