# shellcheck shell=bash
# Shared by prepare.sh and test_train_inference.sh: the params-file parser, program lookup and
# the results.log status lines. Source it after setting TIPC_PROG (the calling script's name,
# used in error lines).
#
# Params file format (PaddlePaddle's TIPC txt files, read by key instead of by line number):
#   ===========================train_params===========================   a section header
#   key:value                  one setting; the value is everything after the first ':'
#   key:a|b                    alternatives: the chain runs once for each
#   key:lite_train_lite_infer=3|whole_train_whole_infer=8   a value per run mode
#   key:null                   not set (the program's default applies)
#   ##, #..., blank lines      separators and comments, ignored; a `null:null` line too
# Keys are the fixed names the sections list below, or `--flag` lines: flags of the section's
# program, checked against its --help, e.g. `--epochs:2` becomes `--epochs=2`.

TIPC_MODES=(lite_train_lite_infer whole_train_whole_infer)
TIPC_SECTIONS=(train_params export_params infer_params)
# Fixed keys per section; flags the scripts set themselves are refused when given as keys.
declare -A TIPC_FIXED_KEYS=(
  [train_params]="model_name gpu_list nodes trainer train_model_name reproducibility_check"
  [export_params]="export exporter"
  [infer_params]="inference compare_results atol rtol"
)
declare -A TIPC_OWNED_FLAGS=(
  [train_params]="--model --output-dir --checkpoint-dir --loss-log"
  [export_params]="--model --pretrained --save-inference-dir"
  [infer_params]="--model-dir"
)
# The program each section's --flags belong to, unless the params file names another.
declare -A TIPC_PROGRAM_KEY=([train_params]=trainer [export_params]=exporter [infer_params]=inference)
declare -A TIPC_DEFAULT_PROGRAM=([train_params]=train [export_params]=export_model [infer_params]=infer)

declare -A TIPC_VALUE=()  # "section/key" -> raw value
declare -A TIPC_LINE=()   # "section/key" -> line number
declare -A TIPC_KEYS=()   # section -> keys in file order, space separated
TIPC_PARAMS=""
TIPC_MODE=""

# One error line, exit 1. Bad input never gets further than this.
tipc_die() {
  echo "$TIPC_PROG: error: $*" >&2
  exit 1
}

# tipc_parse PARAMS_FILE MODE: reads and checks the file's structure and fixed keys. --flag
# keys are checked against the programs by tipc_check_flags (which needs the build).
tipc_parse() {
  TIPC_PARAMS=$1
  TIPC_MODE=$2
  [ -f "$TIPC_PARAMS" ] || tipc_die "params file '$TIPC_PARAMS' does not exist"
  local m known_mode=0
  for m in "${TIPC_MODES[@]}"; do [ "$m" = "$TIPC_MODE" ] && known_mode=1; done
  [ $known_mode -eq 1 ] || tipc_die "mode '$TIPC_MODE' is not one of: ${TIPC_MODES[*]}"

  local line n=0 section="" key value name
  while IFS= read -r line || [ -n "$line" ]; do
    n=$((n + 1))
    line=${line%$'\r'}
    line=${line%"${line##*[![:space:]]}"}  # trailing blanks
    [ -z "$line" ] && continue
    [[ $line == \#* ]] && continue
    if [[ $line =~ ^=+([A-Za-z_]*)=+$ ]]; then
      name=${BASH_REMATCH[1]}
      section=""
      for m in "${TIPC_SECTIONS[@]}"; do [ "$m" = "$name" ] && section=$name; done
      [ -n "$section" ] ||
        tipc_die "$TIPC_PARAMS:$n: unknown section '$name' (expected one of: ${TIPC_SECTIONS[*]})"
      continue
    fi
    [[ $line == *:* ]] || tipc_die "$TIPC_PARAMS:$n: expected key:value, got '$line'"
    key=${line%%:*}
    value=${line#*:}
    [ "$key" = null ] && continue
    [ -n "$section" ] || tipc_die "$TIPC_PARAMS:$n: key '$key' comes before any section header"
    [ -n "$key" ] || tipc_die "$TIPC_PARAMS:$n: empty key in '$line'"
    if [[ $key == --* ]]; then
      key=--${key#--}
      key=${key//_/-}  # --batch_size and --batch-size are the same flag
      local owned
      for owned in ${TIPC_OWNED_FLAGS[$section]}; do
        [ "$owned" = "$key" ] &&
          tipc_die "$TIPC_PARAMS:$n: $key is set by $TIPC_PROG itself; remove this line"
      done
    elif [[ " ${TIPC_FIXED_KEYS[$section]} " != *" $key "* ]]; then
      tipc_die "$TIPC_PARAMS:$n: unknown key '$key' in $section (known: ${TIPC_FIXED_KEYS[$section]}, or a --flag of the program)"
    fi
    [ -z "${TIPC_LINE[$section/$key]+x}" ] ||
      tipc_die "$TIPC_PARAMS:$n: key '$key' is already set on line ${TIPC_LINE[$section/$key]}"
    TIPC_VALUE[$section/$key]=$value
    TIPC_LINE[$section/$key]=$n
    TIPC_KEYS[$section]+="$key "
  done <"$TIPC_PARAMS"
  for key in model_name gpu_list; do
    [ -n "${TIPC_LINE[train_params/$key]+x}" ] ||
      tipc_die "$TIPC_PARAMS: train_params has no '$key' line"
  done
  [ -n "${TIPC_LINE[export_params/export]+x}" ] ||
    tipc_die "$TIPC_PARAMS: export_params has no 'export' line (rank0, export_model or both: rank0|export_model)"
  # Resolve every value for the mode now, so a bad mode selection is reported up front.
  for section in "${TIPC_SECTIONS[@]}"; do
    for key in ${TIPC_KEYS[$section]:-}; do tipc_value "$section" "$key" >/dev/null; done
  done
}

# tipc_value SECTION KEY [DEFAULT]: the value for the run mode (alternatives still joined by
# '|'), "null" as empty. Missing keys give DEFAULT. Dies on a mode selection without the mode.
tipc_value() {
  local section=$1 key=$2
  if [ -z "${TIPC_LINE[$section/$key]+x}" ]; then
    printf '%s' "${3:-}"
    return 0
  fi
  local raw=${TIPC_VALUE[$section/$key]} n=${TIPC_LINE[$section/$key]} out=""
  # A mode selection: every '|' part is <mode>=<value>, a mode being a name ending in _infer.
  if [[ $raw =~ ^[A-Za-z_]+_infer= ]]; then
    local part mode found=0 m known
    local -a parts
    IFS='|' read -r -a parts <<<"$raw"
    for part in "${parts[@]}"; do
      [[ $part =~ ^([A-Za-z_]+)=(.*)$ ]] ||
        tipc_die "$TIPC_PARAMS:$n: $key: '$part' is not <mode>=<value> (the value selects by mode)"
      mode=${BASH_REMATCH[1]}
      known=0
      for m in "${TIPC_MODES[@]}"; do [ "$m" = "$mode" ] && known=1; done
      [ $known -eq 1 ] ||
        tipc_die "$TIPC_PARAMS:$n: $key: unknown mode '$mode' (modes: ${TIPC_MODES[*]})"
      if [ "$mode" = "$TIPC_MODE" ]; then
        out=${BASH_REMATCH[2]}
        found=1
      fi
    done
    [ $found -eq 1 ] || tipc_die "$TIPC_PARAMS:$n: $key has no value for mode $TIPC_MODE"
  else
    out=$raw
  fi
  [ "$out" = null ] && out=""
  printf '%s' "$out"
}

# tipc_line SECTION KEY: the line number, for error messages.
tipc_line() { printf '%s' "${TIPC_LINE[$1/$2]:-?}"; }

# tipc_program NAME: the path of a built program (train, export_model, infer, dpar-launch,
# make_lite_data) in DPAR_BUILD_DIR, or an absolute path as given.
tipc_program() {
  local name=$1 dir
  if [[ $name == /* ]]; then
    [ -x "$name" ] || tipc_die "program '$name' is not an executable file"
    printf '%s' "$name"
    return 0
  fi
  for dir in examples/mobilenetv3 examples/mobilenetv3/test_tipc launch; do
    if [ -x "$DPAR_BUILD_DIR/$dir/$name" ]; then
      printf '%s' "$DPAR_BUILD_DIR/$dir/$name"
      return 0
    fi
  done
  tipc_die "'$name' is not built in $DPAR_BUILD_DIR (build it: cmake --build $DPAR_BUILD_DIR --target $name; or set DPAR_BUILD_DIR)"
}

# tipc_check_flags SECTION: every --flag key must be a flag of the section's program.
tipc_check_flags() {
  local section=$1 key program help
  program=$(tipc_program "$(tipc_value "$section" "${TIPC_PROGRAM_KEY[$section]}" \
    "${TIPC_DEFAULT_PROGRAM[$section]}")") || exit 1
  help=$("$program" --help 2>&1) || tipc_die "'$program --help' failed: $help"
  for key in ${TIPC_KEYS[$section]:-}; do
    [[ $key == --* ]] || continue
    grep -qE "^  ${key}( |$)" <<<"$help" ||
      tipc_die "$TIPC_PARAMS:$(tipc_line "$section" "$key"): unknown key '$key' in $section: $(basename "$program") has no such flag (see $(basename "$program") --help)"
  done
}

# tipc_flag_keys SECTION: the --flag keys in file order.
tipc_flag_keys() {
  local key
  for key in ${TIPC_KEYS[$1]:-}; do [[ $key == --* ]] && printf '%s\n' "$key"; done
  return 0
}

# status_check RC COMMAND RESULTS_LOG: the TIPC status line, on stdout and in results.log.
status_check() {
  local rc=$1 command=$2 log=$3 line
  if [ "$rc" -eq 0 ]; then
    line="Run successfully with command - ${command}!"
  else
    line="Run failed with command - ${command}!"
  fi
  echo "$line"
  echo "$line" >>"$log"
}

# tipc_start <params file> <mode>: the common start of both scripts. Checks the arguments,
# sets params, mode and DPAR_BUILD_DIR (default <repo>/build; needs $repo), parses the params
# file and checks every section's program flags, so bad input stops before anything runs.
tipc_start() {
  if [ $# -ne 2 ]; then
    echo "usage: $TIPC_PROG <params file> <mode: ${TIPC_MODES[*]}>" >&2
    exit 2
  fi
  params=$(realpath -m -- "$1")
  mode=$2
  DPAR_BUILD_DIR=$(realpath -m -- "${DPAR_BUILD_DIR:-$repo/build}")
  tipc_parse "$params" "$mode"
  local section
  for section in "${TIPC_SECTIONS[@]}"; do tipc_check_flags "$section"; done
}
