# The peer's sandbox image for the benchmarks: the same base as ours, with what rlms' DockerREPL
# needs (`python` on PATH, dill and requests importable) and nothing fetched from a network.
# Built by bench/peer.py from an in-memory context: the host's pure-Python copies of the packages
# and a no-op `pip` (the peer runs `pip install -q dill requests` in every new container).
ARG BASE_IMAGE=python:3.12-slim
FROM ${BASE_IMAGE}
COPY site/ /opt/peer/site/
COPY bin/ /opt/peer/bin/
ENV PATH=/opt/peer/bin:$PATH \
    PYTHONPATH=/opt/peer/site
# `python` for a base that has only python3; precompiled like a pip install would leave it;
# fail the build here if a package does not import on the image's Python.
RUN if ! command -v python >/dev/null 2>&1; then ln -s "$(command -v python3)" /opt/peer/bin/python; fi \
 && python -m compileall -q /opt/peer/site \
 && python -c "import dill, requests, urllib3, idna, charset_normalizer, certifi" \
 && out="$(pip install -q dill requests)" && test -z "$out"
