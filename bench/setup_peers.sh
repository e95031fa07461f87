#!/usr/bin/env bash
# Builds the peer venv that bench/cache_ops.py and bench/hashing.py run SGLang and vLLM in:
# sglang and vllm installed with --no-deps, plus exactly the modules their cache classes
# (sglang.srt.mem_cache.radix_cache, vllm.v1.core.kv_cache_manager) import on a CPU-only
# machine, found by importing them until nothing was missing. Never part of kvtide's venv.
#
#   bash bench/setup_peers.sh [VENV]        # default /work/venvs/peerlibs
#
# torch==2.13.0 resolves to the CPU wheel on this machine's local disk (pip's find-links);
# elsewhere point pip at a CPU build (--index-url .../whl/cpu) or it fetches the CUDA one.
# torchvision is deliberately absent (PyPI's wheels are CUDA builds that do not load against a
# CPU torch); bench/cache_workers.py stubs the three torchvision modules SGLang's config
# package imports, and says why there.
set -euo pipefail

VENV="${1:-/work/venvs/peerlibs}"
PYTHON="${PYTHON:-python3}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/pip" install -q --disable-pip-version-check)

"${PIP[@]}" torch==2.13.0 numpy==2.4.6
"${PIP[@]}" --no-deps sglang==0.5.23 vllm==0.33.0
# What the two cache modules import, transitively, and nothing else. Pinned to the versions
# this was built and measured with.
"${PIP[@]}" --no-deps \
  aiohappyeyeballs==2.7.1 aiohttp==3.14.5 aiosignal==1.4.0 annotated-doc==0.0.7 \
  annotated-types==0.8.0 anyio==4.16.0 apache-tvm-ffi==0.1.15.post2 attrs==26.1.0 \
  cachetools==8.0.2 cbor2==6.3.0 certifi==2026.10.19.post1 cloudpickle==3.1.3 \
  compressed-tensors==0.20.1 dill==0.4.1 fastapi==0.165.0 frozenlist==1.8.0 gguf==0.19.0 \
  h11==0.16.0 httpcore2==2.16.2 httpx2==2.16.2 huggingface_hub==2.4.0 idna==3.20 \
  ipython==9.18.1 llguidance==1.9.1 loguru==0.7.3 msgspec==0.23.0 multidict==7.2.1 \
  openai==3.57.0 openai-harmony==0.0.8 opentelemetry-api==1.45.2 orjson==3.13.0 \
  packaging==26.4 partial-json-parser==0.2.1.1.post7 pillow==13.0.0 \
  prometheus_client==0.26.0 propcache==0.5.4 psutil==7.2.2 py-cpuinfo==9.0.0 \
  pybase64==1.5.1 pydantic==2.14.4 pydantic_core==2.50.5 Pygments==2.21.0 PyYAML==6.0.4 \
  pyzmq==27.3.0 regex==2026.11.19 requests==2.34.2 safetensors==0.8.0 \
  sentencepiece==0.2.3 sniffio==1.3.1 starlette==1.10.0 tokenizers==0.23.3 tqdm==4.70.1 \
  traitlets==5.16.1 transformers==5.24.0 triton==3.9.0 truststore==0.10.5 \
  typing-inspection==0.4.5 urllib3==2.8.0 uvloop==0.23.0 xgrammar==0.2.9 yarl==1.25.1

# Prove both cache classes import and construct (takes ~30 s: both packages import a lot).
PYTHONWARNINGS=ignore "$VENV/bin/python" - "$HERE" <<'EOF'
import sys
sys.path.insert(0, sys.argv[1])
import cache_workers

for name in ("sglang", "vllm"):
    system = cache_workers.LOADERS[name]()
    system(1600)
    print(f"{name} {system.version}: ok")
EOF
echo "peer venv ready: $VENV/bin/python"
