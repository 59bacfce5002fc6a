#!/usr/bin/env bash
# The GPU check (docs/gpu-check.md), run on a bare GPU machine: one whose
# image has Python, torch, CUDA and NCCL but none of co2's C++ libraries.
# It needs build-gpu-check/ beside the tree, which scripts/gpu_check_prepare.sh
# makes on a Debian machine (carry it along). In under 8 minutes it runs:
#
#   environment      what the machine has (Python, torch, CUDA, NCCL, GPUs, tools)
#   prepared         build-gpu-check exists, matches this tree, has _core for this Python
#   libraries        every prepared binary finds its libraries here
#   import           `import co2` with the prepared package
#   node_run_cpu     2 ranks under torchrun, CPU parameters, local co2-aggregator shards
#   -- the steps below need a GPU; without one they are skipped, and said so --
#   test_cuda        pytest python/tests/test_cuda.py (its tests must run, not skip)
#   nccl_group_test  the NCCL group's gtest (a test that needs a device must run)
#   node_run_cuda    2 ranks on one GPU, CUDA parameters, local co2-aggregator shards
#   co2_train        co2-train --workers=1 --local_ranks=2 on local shards, when
#                    $CO2_TRAIN names a co2-train that runs here (else not run)
#
#   scripts/gpu_check.sh [RESULT_DIR]    default: $OUT, else build-gpu-check-results
#
# It writes RESULT_DIR/summary.json (each step's status, seconds, reason and
# what it saw; the verdict) and RESULT_DIR/gpu_check.log (every step's
# output), plus test_cuda.xml, nccl_group_test.json and node_run_*.json.
# Exit status: 1 if a step that should have run failed, else 0. Without a GPU
# the verdict is "no_gpu" (exit 0): the GPU checks were not run and are not
# claimed to pass.
#
# Environment: CO2_GPU_CHECK_DIR (the prepared folder), CO2_GPU_CHECK_PYTHON
# (default python3), CO2_GPU_CHECK_BUDGET (seconds for everything, default
# 450), CO2_TRAIN and CO2_TRAIN_ARGS (the co2_train step),
# CO2_GPU_CHECK_ASSUME_GPU=1 (run the GPU steps even where no GPU is seen:
# a self-test of this script, under which they must fail).
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
CHECK_DIR=${CO2_GPU_CHECK_DIR:-$ROOT/build-gpu-check}
RESULTS=${1:-${OUT:-$ROOT/build-gpu-check-results}}
PYTHON=${CO2_GPU_CHECK_PYTHON:-python3}
BUDGET=${CO2_GPU_CHECK_BUDGET:-450}
START=$(date +%s)
mkdir -p "$RESULTS"
LOG=$RESULTS/gpu_check.log
: >"$LOG"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
STEPS=$WORK/steps.tsv
: >"$STEPS"

say() { echo "gpu_check: $*" | tee -a "$LOG"; }

# record NAME STATUS RC SECONDS REASON
record() {
  printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "${5//$'\t'/ }" >>"$STEPS"
  say "$1: $2${5:+ ($5)} [${4}s]"
}

# run_step NAME MAX_SECONDS CMD...: runs CMD with a timeout that keeps the
# whole check inside BUDGET; its output goes to the log and to WORK/NAME.out.
# Returns CMD's status (124 on a timeout). The caller judges and records.
STEP_SECONDS=0
run_step() {
  local name=$1 max=$2; shift 2
  local left=$(( BUDGET - ($(date +%s) - START) - 10 ))
  local limit=$(( max < left ? max : left ))
  STEP_SECONDS=0
  if [ "$limit" -lt 5 ]; then
    echo "no time left in the ${BUDGET}s budget" >"$WORK/$name.out"
    return 125
  fi
  echo "===== $name (timeout ${limit}s): $*" >>"$LOG"
  local t0; t0=$(date +%s)
  # bash -c: CMD may be one of the functions exported below.
  timeout -k 10 "$limit" bash -c '"$@"' bash "$@" >"$WORK/$name.out" 2>&1
  local rc=$?
  STEP_SECONDS=$(( $(date +%s) - t0 ))
  cat "$WORK/$name.out" >>"$LOG"
  echo "===== $name: exit $rc after ${STEP_SECONDS}s" >>"$LOG"
  return $rc
}

# The plain verdict of a step: passed on exit 0, else failed with a reason.
judge() {  # NAME RC [REASON-ON-FAILURE]
  local name=$1 rc=$2
  if [ "$rc" -eq 0 ]; then
    record "$name" passed 0 "$STEP_SECONDS" ""
  elif [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    record "$name" failed "$rc" "$STEP_SECONDS" "timed out"
  elif [ "$rc" -eq 125 ]; then
    record "$name" failed "$rc" 0 "no time left in the ${BUDGET}s budget"
  else
    record "$name" failed "$rc" "$STEP_SECONDS" "${3:-exit $rc; see gpu_check.log}"
  fi
}

say "results in $RESULTS; prepared folder $CHECK_DIR; budget ${BUDGET}s"

# --- environment (never fails: it says what is here) -----------------------
run_step environment 60 "$PYTHON" - "$WORK/env.json" <<'EOF'
import glob, json, os, platform, shutil, site, subprocess, sys
env = {"python": sys.version.split()[0], "python_executable": sys.executable,
       "machine": platform.machine(), "kernel": platform.release()}
try:
    import torch
    env["torch"] = torch.__version__
    env["torch_cuda"] = torch.version.cuda
    env["cuda_available"] = torch.cuda.is_available()
    env["cuda_device_count"] = torch.cuda.device_count()
    if env["cuda_device_count"]:
        env["cuda_device"] = torch.cuda.get_device_name(0)
        try:
            env["torch_nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception as e:  # noqa: BLE001 - only informational
            env["torch_nccl"] = f"unknown: {e}"
except Exception as e:  # noqa: BLE001
    env["torch"] = f"not importable: {e}"
    env["cuda_device_count"] = 0
for tool in ["nvidia-smi", "nvcc", "cmake", "ninja", "g++", "c++", "git", "patchelf"]:
    env["tool_" + tool] = shutil.which(tool)
if shutil.which("nvidia-smi"):
    p = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    env["nvidia_smi_L"] = (p.stdout + p.stderr).strip()
    env["nvidia_smi_gpus"] = sum(l.startswith("GPU ") for l in p.stdout.splitlines())
else:
    env["nvidia_smi_gpus"] = 0
# Where this machine's NCCL and CUDA runtime are: its pip packages (torch's
# nvidia-* wheels), the CUDA toolkit, the loader's cache.
dirs = []
roots = site.getsitepackages() + [site.getusersitepackages()]
patterns = [os.path.join(r, "nvidia", "**", "lib", n) for r in roots
            for n in ("libnccl.so.2", "libcudart.so.1*")]
patterns += ["/usr/local/cuda*/lib*/libnccl.so.2", "/usr/local/cuda*/lib*/libcudart.so.1*",
             "/usr/local/cuda*/targets/*/lib/libcudart.so.1*",
             "/usr/lib/x86_64-linux-gnu/libnccl.so.2"]
for pat in patterns:
    for f in sorted(glob.glob(pat, recursive=True)):
        d = os.path.dirname(os.path.realpath(f))
        if d not in dirs:
            dirs.append(d)
env["cuda_nccl_lib_dirs"] = dirs
json.dump(env, open(sys.argv[1], "w"), indent=1)
print(json.dumps(env, indent=1))
EOF
rc=$?
[ -f "$WORK/env.json" ] || echo '{}' >"$WORK/env.json"
record environment "$([ $rc -eq 0 ] && echo passed || echo failed)" "$rc" "$STEP_SECONDS" \
  "$([ $rc -ne 0 ] && echo "$PYTHON could not describe the machine")"
envget() { "$PYTHON" -c 'import json,sys; v=json.load(open(sys.argv[1])).get(sys.argv[2]); print(":".join(v) if isinstance(v, list) else ("" if v is None else v))' "$WORK/env.json" "$1" 2>/dev/null; }
GPUS_SMI=$(envget nvidia_smi_gpus); GPUS_TORCH=$(envget cuda_device_count)
GPU_PRESENT=false
if [ "${GPUS_SMI:-0}" -gt 0 ] 2>/dev/null || [ "${GPUS_TORCH:-0}" -gt 0 ] 2>/dev/null; then
  GPU_PRESENT=true
fi
# A self-test of the GPU branch on a machine without one (docs/gpu-check.md):
# every GPU step must then fail, never pass.
if [ "${CO2_GPU_CHECK_ASSUME_GPU:-}" = 1 ]; then
  GPU_PRESENT=true
  say "CO2_GPU_CHECK_ASSUME_GPU=1: running the GPU steps as if a GPU were present"
fi
CUDA_LIBS=$(envget cuda_nccl_lib_dirs)
export LD_LIBRARY_PATH=${CUDA_LIBS}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PYTHONPATH=$CHECK_DIR/python${PYTHONPATH:+:$PYTHONPATH}
export CO2_AGGREGATOR=$CHECK_DIR/bin/co2-aggregator
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
say "GPU present: $GPU_PRESENT (nvidia-smi: ${GPUS_SMI:-0}, torch: ${GPUS_TORCH:-0}); CUDA/NCCL libraries from: ${CUDA_LIBS:-none found}"

# --- prepared ----------------------------------------------------------------
check_prepared() {
  local ext want have
  [ -f "$CHECK_DIR/MANIFEST.json" ] || { echo "no $CHECK_DIR/MANIFEST.json: run scripts/gpu_check_prepare.sh and carry build-gpu-check"; return 1; }
  ext=$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
  [ -f "$CHECK_DIR/python/co2/_core$ext" ] || { echo "no _core$ext for $PYTHON in $CHECK_DIR/python/co2 (built: $(cd "$CHECK_DIR/python/co2" && ls _core*)); prepare with CO2_GPU_PYTHON naming this Python's version"; return 1; }
  want=$("$PYTHON" "$ROOT/scripts/gpu_check_digest.py")
  have=$("$PYTHON" -c 'import json,sys; print(json.load(open(sys.argv[1])).get("sources_digest",""))' "$CHECK_DIR/MANIFEST.json")
  cat "$CHECK_DIR/MANIFEST.json" | head -12
  [ "$want" = "$have" ] || { echo "prepared from other sources (digest $have, this tree $want): rerun scripts/gpu_check_prepare.sh"; return 1; }
  echo "prepared from these sources (digest $want), _core$ext present"
}
export -f check_prepared
export ROOT CHECK_DIR RESULTS PYTHON
run_step prepared 60 check_prepared
rc=$?; judge prepared $rc "$(tail -1 "$WORK/prepared.out")"
PREPARED_OK=$([ $rc -eq 0 ] && echo true || echo false)

# --- libraries -----------------------------------------------------------------
check_libraries() {
  local f missing=0
  for f in "$CHECK_DIR"/bin/* "$CHECK_DIR"/python/co2/_core*.so; do
    if ldd "$f" | grep 'not found'; then
      echo "$f: libraries not found"; missing=1
    fi
  done
  [ $missing -eq 0 ] && echo "every prepared binary finds its libraries"
  return $missing
}
if $PREPARED_OK || [ -d "$CHECK_DIR/bin" ]; then
  export -f check_libraries
  run_step libraries 30 check_libraries; judge libraries $? "$(tail -1 "$WORK/libraries.out")"
else
  record libraries failed 1 0 "no prepared folder"
fi

# --- import --------------------------------------------------------------------
run_step import 60 "$PYTHON" -c 'import co2, torch; print("co2", co2.__version__, "from", co2.__file__, "on torch", torch.__version__); print("aggregator:", co2.find_aggregator())'
judge import $? "$(tail -1 "$WORK/import.out")"

# --- node_run_cpu: the plumbing without a GPU -------------------------------------
node_run() {  # NAME DEVICE MAX
  local name=$1 device=$2 max=$3
  run_step "$name" "$max" "$PYTHON" "$ROOT/scripts/gpu_check_node.py" --device "$device" \
    --timeout $(( max - 15 ))
  local rc=$?
  grep '^node_run: ' "$WORK/$name.out" | tail -1 | sed 's/^node_run: //' >"$RESULTS/$name.json"
  [ -s "$RESULTS/$name.json" ] || rm -f "$RESULTS/$name.json"
  judge "$name" $rc "$(grep '^node_run: ' "$WORK/$name.out" | tail -1 | cut -c1-300)"
}
node_run node_run_cpu cpu 120

# --- the GPU steps ---------------------------------------------------------------
GPU_STEPS=(test_cuda nccl_group_test node_run_cuda co2_train)
if ! $GPU_PRESENT; then
  say "NO GPU on this machine: the GPU checks (${GPU_STEPS[*]}) are SKIPPED, not passed"
  for s in "${GPU_STEPS[@]}"; do
    record "$s" skipped "" 0 "no GPU present (nvidia-smi and torch see none)"
  done
else
  # test_cuda: the suite's CUDA tests, which must run rather than skip.
  run_step test_cuda 200 "$PYTHON" -m pytest -v -rs -p no:cacheprovider \
    --junitxml="$RESULTS/test_cuda.xml" "$ROOT/python/tests/test_cuda.py"
  rc=$?
  if [ $rc -eq 0 ] && grep -q '<skipped' "$RESULTS/test_cuda.xml" 2>/dev/null; then
    record test_cuda failed 0 "$STEP_SECONDS" "tests skipped although a GPU is present: $(grep -m1 -o 'SKIPPED.*' "$WORK/test_cuda.out")"
  else
    judge test_cuda $rc "$(grep -E '(passed|failed|error)' "$WORK/test_cuda.out" | tail -1)"
  fi

  # nccl_group_test: a test that needs a device (OneRankAllReduceAndBroadcast
  # on one GPU) must have run.
  run_step nccl_group_test 120 "$CHECK_DIR/bin/nccl_group_test" \
    --gtest_output=json:"$RESULTS/nccl_group_test.json"
  rc=$?
  ran=$(grep -c '^\[       OK \]' "$WORK/nccl_group_test.out")
  skipped=$(grep '^\[  SKIPPED \]' "$WORK/nccl_group_test.out" | grep -v 'test.*, listed below' | tr '\n' ' ')
  if [ $rc -eq 0 ] && ! grep -q '^\[       OK \] NcclGroup.OneRankAllReduceAndBroadcast' "$WORK/nccl_group_test.out"; then
    record nccl_group_test failed 0 "$STEP_SECONDS" "OneRankAllReduceAndBroadcast did not run on the GPU (skipped: $skipped)"
  else
    judge nccl_group_test $rc "$(grep -E '^\[  FAILED  \]' "$WORK/nccl_group_test.out" | head -1)"
    [ $rc -eq 0 ] && say "nccl_group_test: $ran ran; skipped (need more GPUs or none): ${skipped:-none}"
  fi

  node_run node_run_cuda cuda 150

  # co2_train: only with a co2-train that runs here ($CO2_TRAIN). The
  # prepared folder has none: co2-train links LibTorch, and the machine's
  # LibTorch is its pip torch's, which a Debian machine cannot link against.
  if [ -n "${CO2_TRAIN:-}" ] && [ -x "$CO2_TRAIN" ]; then
    co2_train() {
      "$PYTHON" - "$CO2_TRAIN" "$RESULTS/co2_train.json" ${CO2_TRAIN_ARGS:-} <<'EOF'
import subprocess, sys
import co2
train, report, extra = sys.argv[1], sys.argv[2], sys.argv[3:]
with co2.local_aggregator(num_shards=2) as agg:
    cmd = [train, "--workers=1", "--local_ranks=2", "--tau=4", "--steps=32",
           "--eval_every=0", "--final_eval_examples=200", "--progress=false",
           f"--aggregators={','.join(agg.addresses)}", f"--report={report}", *extra]
    print("+", " ".join(cmd), flush=True)
    sys.exit(subprocess.run(cmd).returncode)
EOF
    }
    export -f co2_train
    export CO2_TRAIN CO2_TRAIN_ARGS=${CO2_TRAIN_ARGS:-}
    run_step co2_train 150 co2_train
    judge co2_train $? "$(tail -1 "$WORK/co2_train.out")"
  else
    record co2_train not_run "" 0 "no co2-train for this machine (set CO2_TRAIN): it links LibTorch, which here is only the pip torch's; the sliced CUDA run is node_run_cuda"
  fi
fi

# --- summary -----------------------------------------------------------------------
"$PYTHON" - "$STEPS" "$WORK/env.json" "$RESULTS" "$GPU_PRESENT" "$(( $(date +%s) - START ))" "$BUDGET" <<'EOF' | tee -a "$LOG"
import json, os, sys
steps_file, env_file, results, gpu, seconds, budget = sys.argv[1:7]
gpu = gpu == "true"
steps = []
for line in open(steps_file):
    name, status, rc, secs, reason = (line.rstrip("\n").split("\t") + [""] * 5)[:5]
    step = {"name": name, "status": status, "seconds": int(secs or 0)}
    if rc:
        step["exit"] = int(rc)
    if reason:
        step["reason"] = reason
    seen = os.path.join(results, name + ".json")
    if name.startswith("node_run") and os.path.exists(seen):
        step["saw"] = json.load(open(seen))
    steps.append(step)
failed = [s["name"] for s in steps if s["status"] == "failed"]
gpu_steps = [s for s in steps if s["name"] in ("test_cuda", "nccl_group_test", "node_run_cuda")]
if failed:
    verdict = "failed"
elif not gpu:
    verdict = "no_gpu"
else:
    verdict = "passed" if all(s["status"] == "passed" for s in gpu_steps) else "failed"
summary = {"verdict": verdict, "gpu_present": gpu,
           "gpu_checks_passed": bool(gpu and verdict == "passed"),
           "failed": failed, "seconds": int(seconds), "budget_seconds": int(budget),
           "environment": json.load(open(env_file)), "steps": steps}
if not gpu:
    summary["note"] = ("no GPU on this machine: test_cuda, nccl_group_test, node_run_cuda "
                       "and co2_train were skipped; nothing here says they pass")
json.dump(summary, open(os.path.join(results, "summary.json"), "w"), indent=1)
print(f"gpu_check: verdict {verdict} in {seconds}s (budget {budget}s)")
for s in steps:
    print(f"  {s['name']:<16} {s['status']:<8} {s['seconds']:>4}s  {s.get('reason', '')[:150]}")
sys.exit(1 if verdict == "failed" else 0)
EOF
exit "${PIPESTATUS[0]}"
