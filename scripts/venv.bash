# Sourced by the scripts (not run): the Python they use. The active virtual environment when there is one
# ($VIRTUAL_ENV), else the checkout's own .venv (scripts/install makes it), so the set-up never installs into
# the system's Python.
if [ -z "${VIRTUAL_ENV:-}" ] && [ -x .venv/bin/python3 ]; then
  export VIRTUAL_ENV="$PWD/.venv"
  export PATH="$VIRTUAL_ENV/bin:$PATH"
fi
