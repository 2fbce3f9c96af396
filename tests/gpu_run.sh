#!/usr/bin/env bash
# The GPU recipe, run on the lent H200 through the device tool (see CONTRIBUTING.md):
# installs the wheel built here (carried in wheels/), runs the GPU-marked tests,
# compute-sanitizer memcheck + racecheck on a small batch, and the GPU benchmark.
# Logs go to $OUT. STEPS selects parts: "tests portable sanitize bench loop attention" (default:
# all; "portable" re-runs the attention tests, and "attention-portable" the attention bench,
# through the portable kernel that compute capability 9.0 otherwise skips; "attention-sm120"
# the same bench at sm_120's occupancy (DDTREE_ATTENTION=sm120); "attention-ab" times
# ddtree's attention alone with two builds, WHEELS and WHEELS_B, in turn (tests/attention_ab.py),
# "build-ab" the build bench (BENCH_ARGS) the same way, and "accept-ab" the accept bench
# (SAMPLING_ARGS); "sampling" times sampled against
# greedy accept, the shortlist's draw against sample_row's (and WHEELS_B's, when set);
# "host" times the host side of each Stepper call; "tp" the vocab-parallel build on CUDA
# (tests; with two GPUs, `bench --vocab-parallel --device cuda`); "parts" breaks one attention shape's
# call into its kernels and gaps (PARTS_ARGS: family bs N prefixes); "hunt" adds issue
# 12's long top-k tie search, HUNT_SECONDS long; "ncu-build" runs Nsight Compute on one
# build (and accept) of each NCU_SHAPES entry (tests/gpu_build_one.py), "ncu-attention" on
# one attention call of each NCU_ATTN entry (tests/gpu_attention_one.py); "sglang" runs ddtree against SGLang 0.5.23's
# kernels and its stage-by-stage benchmark, SGLANG_ARGS, with tests/.sglang-0.5.23 carried);
# PYTEST_K (a -k expression), BENCH_ARGS, LOOP_ARGS and ATTN_ARGS narrow the tests and
# benchmarks; WHEELS names the folder the wheel comes from (default wheels/; another, such
# as wheels_base/, lets one call compare two builds).
set -u
OUT=${OUT:-/tmp/ddtree-gpu-out}
STEPS=${STEPS:-"tests portable sanitize bench loop attention"}
mkdir -p "$OUT"
# Installs the wheel in folder $1 into /tmp/site, in place of any other (a warm machine
# keeps the last wheel; pip --target would not replace it).
install_wheel() {
    rm -rf /tmp/site
    pip install --no-index --no-deps --target /tmp/site "$1"/ddtree-*.whl >/tmp/install.log 2>&1 \
        || { cat /tmp/install.log; return 1; }
}
# The two-build steps: runs "${@:2}" AB_PASSES (default 2) times with the wheels of WHEELS
# (A) and WHEELS_B (B) installed in turn, appending to $OUT/$1-A.txt and $OUT/$1-B.txt;
# and with each folder of WHEELS_MORE (space-separated; sides C, D, ...) after them.
ab_sides() {
    local letters=(C D E F G) i=0 w
    echo "A:${WHEELS:-wheels} B:${WHEELS_B:?the step needs WHEELS_B}"
    for w in ${WHEELS_MORE:-}; do echo "${letters[$i]}:$w"; i=$((i + 1)); done
}
ab_runs() {
    local name=$1 pair
    shift
    for _ in $(seq "${AB_PASSES:-2}"); do
        for pair in $(ab_sides); do
            install_wheel "${pair#*:}" || status=1
            limit "$@" >>"$OUT/$name-${pair%%:*}.txt" 2>&1 || status=1
        done
    done
}
install_wheel "${WHEELS:-wheels}" || exit 1
export PYTHONPATH=/tmp/site
# Each command of a step gets STEP_SECONDS (default 300): a kernel that hangs fails its step
# (exit 124) instead of spending the device call's whole time.
limit() { timeout "${STEP_SECONDS:-300}" "$@"; }
# Nsight Compute with the sections the ncu steps read, as report /tmp/ncu-$1: its text and
# hottest SASS lines into $OUT/ncu-$1.txt, its per-line CSV beside the report. The rest of the
# arguments are ncu's own options, then the command; NCU_ENV (NAME=VALUE words) goes to its
# environment.
ncu_run() {
    local tag=$1 rep=/tmp/ncu-$1
    shift
    limit env ${NCU_ENV:-} ncu --clock-control none -f -o "$rep" \
        --section SpeedOfLight --section Occupancy --section LaunchStats \
        --section WarpStateStats --section MemoryWorkloadAnalysis \
        --section ComputeWorkloadAnalysis --section InstructionStats \
        --section SourceCounters "$@" >/tmp/ncu-run.log 2>&1 || { tail -20 /tmp/ncu-run.log; status=1; }
    ncu --import "$rep.ncu-rep" >"$OUT/ncu-$tag.txt" 2>&1 || status=1
    ncu --import "$rep.ncu-rep" --page source --csv --print-source sass \
        >"$rep-sass.csv" 2>/dev/null || status=1
    python3 tests/ncu_hot_lines.py "$rep-sass.csv" >>"$OUT/ncu-$tag.txt" 2>&1 || status=1
}
# Few files: the device tool returns a limited number of them.
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >"$OUT/gpu-tests.log"
status=0
for step in $STEPS; do
    case $step in
    tests)
        limit python3 -m pytest tests -m gpu -q -p no:cacheprovider -s ${PYTEST_K:+-k "$PYTEST_K"} >>"$OUT/gpu-tests.log" 2>&1 || status=1
        tail -15 "$OUT/gpu-tests.log" ;;
    portable)
        # The attention tests again through the portable (sm_120) kernel on this H100/H200.
        limit env DDTREE_ATTENTION=portable python3 -m pytest tests/test_gpu_attention.py -m gpu -q \
            -p no:cacheprovider ${PYTEST_K:+-k "$PYTEST_K"} >"$OUT/gpu-portable.log" 2>&1 || status=1
        tail -5 "$OUT/gpu-portable.log" ;;
    sanitize)
        for tool in memcheck racecheck; do
            limit compute-sanitizer --tool "$tool" --error-exitcode 3 python3 tests/gpu_small.py \
                >/tmp/sanitizer-$tool.log 2>&1 || status=1
            { echo "== $tool"; tail -3 /tmp/sanitizer-$tool.log; } | tee -a "$OUT/sanitizer.log"
            limit env DDTREE_ATTENTION=portable compute-sanitizer --tool "$tool" --error-exitcode 3 \
                python3 tests/gpu_small.py attention >/tmp/sanitizer-p-$tool.log 2>&1 || status=1
            { echo "== $tool, portable attention"; tail -3 /tmp/sanitizer-p-$tool.log; } \
                | tee -a "$OUT/sanitizer.log"
        done ;;
    loop)
        limit python3 -m ddtree bench --loop --plot "$OUT/loop.png" ${LOOP_ARGS:-} >"$OUT/bench-loop.txt" \
            2>&1 || status=1
        cat "$OUT/bench-loop.txt" ;;
    bench)
        limit python3 -m ddtree.bench_gpu ${BENCH_ARGS:-} >"$OUT/bench-gpu.txt" 2>&1 || status=1
        cat "$OUT/bench-gpu.txt" ;;
    tp)
        # The vocab-parallel build on CUDA: its tests (one GPU a rank over NCCL when there
        # are enough, else sharing one over gloo) and, with two or more GPUs, its benchmark.
        limit python3 -m pytest tests/test_gpu_vocab_parallel.py tests/test_gpu_partials.py -m gpu -q \
            -p no:cacheprovider >"$OUT/gpu-tp.log" 2>&1 || status=1
        tail -5 "$OUT/gpu-tp.log"
        if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
            limit python3 -m ddtree bench --vocab-parallel --device cuda --tp 2 --bs 1 8 64 \
                >>"$OUT/gpu-tp.log" 2>&1 || status=1
            tail -8 "$OUT/gpu-tp.log"
        fi ;;
    host)
        limit python3 -m ddtree bench --host ${HOST_ARGS:-} >"$OUT/bench-host.txt" 2>&1 || status=1
        cat "$OUT/bench-host.txt" ;;
    hunt)
        python3 tests/gpu_hunt_ties.py "${HUNT_SECONDS:-120}" >"$OUT/hunt-ties.txt" 2>&1 || status=1
        cat "$OUT/hunt-ties.txt" ;;
    attention)
        limit python3 -m ddtree bench --attention ${ATTN_ARGS:-} >"$OUT/bench-attention.txt" 2>&1 \
            || status=1
        cat "$OUT/bench-attention.txt" ;;
    parts)
        # Where one shape's call spends its time: eager, graph replay, host, per kernel.
        limit python3 tests/gpu_attention_parts.py ${PARTS_ARGS:-gqa 1 64 128 4096 65536} \
            >>"$OUT/attention-parts.txt" 2>&1 || status=1
        cat "$OUT/attention-parts.txt" ;;
    sglang)
        # ddtree against SGLang 0.5.23's own kernels (tests/.sglang-0.5.23, carried), then
        # the stage-by-stage benchmark against its GPU tree path.
        limit python3 -m pytest tests/test_sglang_release.py -q -p no:cacheprovider \
            >"$OUT/gpu-sglang.log" 2>&1 || status=1
        tail -5 "$OUT/gpu-sglang.log"
        limit python3 tests/gpu_sglang_bench.py ${SGLANG_ARGS:-} --json "$OUT/sglang-bench.json" \
            >"$OUT/sglang-bench.txt" 2>&1 || status=1
        cat "$OUT/sglang-bench.txt" ;;
    ncu-build)
        # Where a build's (and an accept's) time goes: Nsight Compute on one call of each
        # NCU_SHAPES entry BS:B[:greedy|sampled], its sections and its hottest SASS lines;
        # NCU_OPTS, more of ncu's options (a kernel filter, "--warp-sampling-interval 0" for a
        # short kernel's stall samples).
        for shape in ${NCU_SHAPES:-64:255 1:63 64:255:sampled}; do
            IFS=: read -r bs budget acc <<< "$shape"
            # shellcheck disable=SC2086
            ncu_run "$bs-$budget-${acc:-build}" --profile-from-start off ${NCU_OPTS:-} \
                python3 tests/gpu_build_one.py "$bs" "$budget" $acc
        done
        (cd /tmp && tar -czf "$OUT/ncu-sass.tgz" ncu-*-sass.csv) || status=1
        grep -h "Duration\|^  [a-z_]*ddtree\|Memory Throughput\|Compute (SM) Throughput" \
            "$OUT"/ncu-*.txt | head -60 ;;
    ncu-attention)
        # Where one attention call's time goes: Nsight Compute on the attention kernel of each
        # NCU_ATTN entry FAMILY:BS:N:PREFIX (through DDTREE_ATTENTION=AB_ATTENTION when set),
        # its sections and its hottest SASS lines.
        for shape in ${NCU_ATTN:-mla8:1:256:65536}; do
            IFS=: read -r fam bs n prefix <<< "$shape"
            NCU_ENV=${AB_ATTENTION:+DDTREE_ATTENTION=$AB_ATTENTION} ncu_run \
                "attn-$fam-$bs-$n-$prefix" -k regex:ddtree_attention_bf16_d -s 2 -c 1 \
                python3 tests/gpu_attention_one.py "$fam" "$bs" "$n" "$prefix"
        done
        (cd /tmp && tar -czf "$OUT/ncu-attn-sass.tgz" ncu-attn-*-sass.csv) || status=1
        grep -h "Duration\|Registers Per\|Achieved Occupancy\|Warp Cycles Per Issued" \
            "$OUT"/ncu-attn-*.txt | head -40 ;;
    attention-portable)
        limit env DDTREE_ATTENTION=portable python3 -m ddtree bench --attention ${ATTN_ARGS:-} \
            >"$OUT/bench-attention-portable.txt" 2>&1 || status=1
        cat "$OUT/bench-attention-portable.txt" ;;
    attention-ab)
        # Two builds in one call: WHEELS (A) and WHEELS_B (B) installed in turn, AB_PASSES
        # (default 2) passes each of `bench --attention --no-sdpa ATTN_ARGS` (through
        # DDTREE_ATTENTION=AB_ATTENTION when set), then tests/attention_ab.py's table; A is
        # installed again for the steps after.
        ab_runs ab env ${AB_ATTENTION:+DDTREE_ATTENTION=$AB_ATTENTION} python3 -m ddtree bench \
            --attention --no-sdpa ${ATTN_ARGS:-}
        python3 tests/attention_ab.py "$OUT/ab-A.txt" "$OUT/ab-B.txt" "${WHEELS:-wheels}" "$WHEELS_B" \
            | tee "$OUT/attention-ab.txt"
        install_wheel "${WHEELS:-wheels}" || status=1 ;;
    build-ab)
        # The build bench (BENCH_ARGS) with two builds, WHEELS (A) and WHEELS_B (B), and
        # any in WHEELS_MORE (C, ...), in turn, AB_PASSES (default 2) passes each, into
        # build-A.txt, build-B.txt, ...; A is installed again for the steps after.
        ab_runs build python3 -m ddtree.bench_gpu ${BENCH_ARGS:-}
        tail -n 12 "$OUT"/build-?.txt
        # Stage 1's outputs bit for bit: every build's digests equal B's, every pass (with
        # AB_DIGEST=ranks, for a change that moves Z's rounding on purpose, the ranks' alone,
        # and how many cases' log-probs moved).
        ab_runs digest python3 tests/gpu_stage1_digest.py
        pick=.
        [ "${AB_DIGEST:-all}" = ranks ] && pick='\[ranks\]'
        for pair in $(ab_sides); do  # every other build's digests against B's
            side=${pair%%:*}
            [ "$side" = B ] && continue
            if diff <(grep "$pick" "$OUT/digest-$side.txt" | sort -u) \
                <(grep "$pick" "$OUT/digest-B.txt" | sort -u); then
                echo "stage 1 digests (${AB_DIGEST:-all}): $side == B ($(grep -c "$pick" "$OUT/digest-B.txt") lines)"
            else
                echo "stage 1 digests (${AB_DIGEST:-all}): $side DIFFERS from B"; status=1
            fi
        done
        echo "cases whose log-probs or tree moved, A against B: $(diff \
            <(grep '\[all\]' "$OUT/digest-A.txt" | sort -u) \
            <(grep '\[all\]' "$OUT/digest-B.txt" | sort -u) | grep -c '^<')"
        install_wheel "${WHEELS:-wheels}" || status=1 ;;
    accept-ab)
        # The accept bench (tests/gpu_sampling_bench.py, SAMPLING_ARGS: greedy and sampled
        # accepts on flat, llm and deep target rows) with WHEELS (A), WHEELS_B (B) and any in
        # WHEELS_MORE (C, ...) in turn, AB_PASSES (default 2) passes each, into
        # accept-A.txt, accept-B.txt, ...; A is installed again for the steps after.
        ab_runs accept python3 tests/gpu_sampling_bench.py ${SAMPLING_ARGS:-}
        tail -n 11 "$OUT"/accept-?.txt
        install_wheel "${WHEELS:-wheels}" || status=1 ;;
    sampling)
        # Sampled accept against greedy (tests/gpu_sampling_bench.py, SAMPLING_ARGS): draws by
        # shortlist, then by sample_row's passes (DDTREE_SAMPLING=exhaustive); with WHEELS_B,
        # also B's build, then A is installed again for the steps after.
        limit python3 tests/gpu_sampling_bench.py ${SAMPLING_ARGS:-} >"$OUT/sampling-bench.txt" 2>&1 \
            || status=1
        limit env DDTREE_SAMPLING=exhaustive python3 tests/gpu_sampling_bench.py ${SAMPLING_ARGS:-} \
            >>"$OUT/sampling-bench.txt" 2>&1 || status=1
        if [ -n "${WHEELS_B:-}" ]; then
            install_wheel "$WHEELS_B" || status=1
            echo "# the build of $WHEELS_B:" >>"$OUT/sampling-bench.txt"
            limit python3 tests/gpu_sampling_bench.py ${SAMPLING_ARGS:-} >>"$OUT/sampling-bench.txt" \
                2>&1 || status=1
            install_wheel "${WHEELS:-wheels}" || status=1
        fi
        cat "$OUT/sampling-bench.txt" ;;
    attention-sm120)
        limit env DDTREE_ATTENTION=sm120 python3 -m ddtree bench --attention ${ATTN_ARGS:-} \
            >"$OUT/bench-attention-sm120.txt" 2>&1 || status=1
        cat "$OUT/bench-attention-sm120.txt" ;;
    esac
done
exit $status
