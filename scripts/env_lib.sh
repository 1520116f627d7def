# Shared by the cached test-tier environment scripts (vllm_env.sh, trainers_env.sh); sourced.
#
#   env_begin NAME VENV STAMP   exit 0 when STAMP exists; else take VENV/.lock (one build at a
#                               time: a second caller, the test tier while `make test` builds in
#                               the background, waits here and then finds the stamp), clear
#                               VENV/.failed and create the venv with $PY
#   fail MESSAGE                write MESSAGE to VENV/.failed (the tier prints it when it skips),
#                               say it on stderr, exit 1
env_begin() {
  ENV_NAME="$1" ENV_VENV="$2" ENV_STAMP="$3"
  [ -f "$ENV_STAMP" ] && exit 0
  mkdir -p "$ENV_VENV"
  exec 9>"$ENV_VENV/.lock"
  flock 9
  [ -f "$ENV_STAMP" ] && exit 0
  rm -f "$ENV_VENV/.failed"
  echo "$ENV_NAME: building $ENV_VENV (${4:-}; takes minutes, cached afterwards)" >&2
  test -x "$ENV_VENV/bin/python" || "${PY:-python3}" -m venv "$ENV_VENV" \
    || fail "cannot create a venv with ${PY:-python3}"
}

fail() {
  echo "$1" >"$ENV_VENV/.failed"
  echo "$ENV_NAME: $1" >&2
  exit 1
}

env_done() {
  touch "$ENV_STAMP"
  echo "$ENV_NAME: ready ($ENV_VENV)" >&2
}
