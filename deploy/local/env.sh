#!/usr/bin/env bash
# Source this (or run `deploy/local/env.sh CMD...`) to get the runtime environment that makes
# vLLM fast on a CPU machine: torch threads for every core, tcmalloc and Intel OpenMP preloaded
# when present. On a GPU machine it changes nothing but OMP_NUM_THREADS.
_orl_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(nproc)}
_orl_preload=""
for _lib in /usr/lib/x86_64-linux-gnu/libtcmalloc.so.4 "$_orl_root/.venv/lib/libiomp5.so"; do
  [ -f "$_lib" ] && _orl_preload="${_orl_preload:+$_orl_preload:}$_lib"
done
if [ -n "$_orl_preload" ] && [[ ":${LD_PRELOAD:-}:" != *":$_orl_preload:"* ]]; then
  export LD_PRELOAD="${LD_PRELOAD:+$LD_PRELOAD:}$_orl_preload"
fi
unset _lib _orl_preload _orl_root
if [ "${BASH_SOURCE[0]}" = "$0" ] && [ $# -gt 0 ]; then exec "$@"; fi
