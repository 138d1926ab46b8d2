# The sandbox image: any base with python3 on PATH, plus the orchestrator agent and dill.
# Built by `orchestrator image build` from an in-memory context made of the installed package,
# so no checkout of the repository is needed.
ARG BASE_IMAGE=python:3.12-slim
FROM ${BASE_IMAGE}
COPY vendor/ /opt/orchestrator/vendor/
COPY orchestrator_agent/ /opt/orchestrator/orchestrator_agent/
ENV PYTHONPATH=/opt/orchestrator:/opt/orchestrator/vendor \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# Prefer the image's own dill when it has one; precompile so a read-only root starts fast;
# fail the build here, not at session start, if python3 or dill is missing. No setuid or setgid file stays:
# a Swarm service cannot forbid privilege gain on Docker 20.10 (NoNewPrivileges is dropped there).
RUN if PYTHONPATH= python3 -c "import dill" 2>/dev/null; then rm -rf /opt/orchestrator/vendor/dill; fi \
 && find / -xdev -type f -perm /6000 -exec chmod ug-s {} + \
 && python3 -m compileall -q /opt/orchestrator \
 && python3 -c "import dill, orchestrator_agent.supervisor, orchestrator_agent.checkpoint"
# Run by hand, the image stays unprivileged. The controller starts it as root with four capabilities
# (Settings.user), so that the supervisor can run each worker as the sandbox's own uid (docs/identity.md).
USER 65534:65534
WORKDIR /tmp
CMD ["python3", "-m", "orchestrator_agent.supervisor"]
