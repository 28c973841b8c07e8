# Sourced by the command-line checks: `expect_failure MESSAGE FLAGS...` runs
# "$program" FLAGS and fails the check unless it exits non-zero and prints
# MESSAGE (a fixed string) on stdout or stderr.
expect_failure() {
  local message=$1
  shift
  local output status=0
  output=$("$program" "$@" 2>&1) || status=$?
  [ "$status" -ne 0 ] || { echo "$(basename "$program") $* exited 0:"; echo "$output"; exit 1; }
  grep -qF -- "$message" <<<"$output" ||
    { echo "$(basename "$program") $* did not say '$message':"; echo "$output"; exit 1; }
}
