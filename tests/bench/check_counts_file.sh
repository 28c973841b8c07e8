#!/usr/bin/env bash
# bench/gpt2_step_prediction refuses input it would misread, naming what is
# wrong: a --load-counts file from before shared-memory bytes were counted
# (no header, or a header without the column), a bad --calibration file and
# a bad --measured one.
#   check_counts_file.sh PATH_TO_gpt2_step_prediction
set -uo pipefail
bench=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
failures=0

# expect_error NAME FRAGMENT ARGS...: the program fails and says FRAGMENT.
expect_error() {
  local name=$1 fragment=$2
  shift 2
  if "$bench" "$@" >"$dir/out" 2>"$dir/err"; then
    echo "FAIL $name: exited 0"
    failures=$((failures + 1))
  elif ! grep -qF -- "$fragment" "$dir/err"; then
    echo "FAIL $name: stderr does not say \"$fragment\":"
    cat "$dir/err"
    failures=$((failures + 1))
  else
    echo "ok   $name: $(cat "$dir/err")"
  fi
}

printf '1\t4\t64\t973078528\tcublasLtMatmul\t15\t298377600\t17539301376\n' >"$dir/no_header.tsv"
expect_error "a counts file without a header" "no 'shared_bytes' column" --load-counts "$dir/no_header.tsv"

printf '# layers\tbatch\tseq\tpeak_bytes\tkernel\tlaunches\tdevice_bytes\tflops\n1\t4\t64\t1\tk\t1\t2\t3\n' \
  >"$dir/old_header.tsv"
expect_error "a header without shared_bytes" "the header has no 'shared_bytes' column" --load-counts "$dir/old_header.tsv"

printf '# layers\tbatch\tseq\tpeak_bytes\tkernel\tlaunches\tdevice_bytes\tshared_bytes\tflops\n1\t4\t64\t1\tk\t1\t2\n' \
  >"$dir/short_line.tsv"
expect_error "a line with fields missing" "line 2: 7 fields, the header names 9" --load-counts "$dir/short_line.tsv"

echo '{"gpu": "H100", "date": "2026-12-01", "hbm_bytes_per_second": 3e12}' >"$dir/no_source.json"
expect_error "a calibration without a source" "field 'source' is missing" --calibration "$dir/no_source.json"

echo '{"gpu": "H100", "date": "2026-12-01", "source": "x", "gemm": [{"m": 1, "n": 1, "k": 1, "tflops": -1}]}' \
  >"$dir/negative.json"
expect_error "a negative GEMM rate" "gemm[0]: field 'tflops' must be positive" --calibration "$dir/negative.json"

echo '{"gpu": "H100",' >"$dir/bad.json"
expect_error "a calibration that is not JSON" "not valid JSON" --calibration "$dir/bad.json"

echo '{"source": "x", "batch": 16, "seq_len": 1024, "total_ms": 1}' >"$dir/no_kernels.json"
expect_error "a measured step without kernels" 'no "kernels" field' --measured "$dir/no_kernels.json"

echo '{"source": "x", "batch": 8, "seq_len": 1024, "total_ms": 1, "kernels": {}}' >"$dir/batch_8.json"
expect_error "a measured step at a batch not predicted" "B=8 T=1024; the prediction is for T=1024 and B=16, 32 or 64" \
  --measured "$dir/batch_8.json"

exit $((failures > 0))
