#!/usr/bin/env bash
# The train -> export -> infer chain of one params file and run mode, in the shape of
# PaddlePaddle's test_tipc/test_train_inference_python.sh:
#   test_train_inference.sh configs/mobilenet_v3_small/train_infer.txt lite_train_lite_infer
# For every gpu_list entry (and every combination of train_params alternatives):
#   1. training through dpar-launch (one launcher per node of gpu_list; `nodes:netns` puts each
#      in its own network namespace), with checkpoints and a per-step loss log;
#   2. with reproducibility_check:True, the same training again and a byte comparison of the
#      two runs' loss logs (every rank);
#   3. export: `rank0` takes the model rank 0 exported at the end of training, `export_model`
#      runs the export tool on the train_model_name checkpoint (latest, best, model_<epoch>, or
#      final: the weights file);
#   4. inference with every combination of the infer_params alternatives (threads, batch sizes);
#   5. compare_results.sh: the class ids and probabilities of every inference log against the
#      expected results file, within atol/rtol.
# Each command's status goes to output/<model>/<mode>/results.log as
# `Run successfully with command - <cmd>!` or `Run failed with command - <cmd>!`, its output to
# a log beside it. Exit status: 0 all passed, 1 something failed (or bad input: one error line,
# nothing run), 77 skipped (`nodes:netns` without CAP_NET_ADMIN).
# Paths in params files are relative to this folder. Environment: DPAR_BUILD_DIR (default
# <repo>/build), DPAR_TIPC_OUTPUT (default <this folder>/output), DPAR_TIPC_TIMEOUT (seconds per
# command, default 0: none).
set -uo pipefail
TIPC_PROG=test_train_inference.sh
tipc_dir=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$tipc_dir/../../.." && pwd)
source "$repo/tests/port_block.sh"
# shellcheck source=common_func.sh
source "$tipc_dir/common_func.sh"

out_root=$(realpath -m -- "${DPAR_TIPC_OUTPUT:-$tipc_dir/output}")
timeout_s=${DPAR_TIPC_TIMEOUT:-0}

# ---- read and check everything before anything runs or is written --------------------------
tipc_start "$@"
launch=$(tipc_program dpar-launch) || exit 1
trainer=$(tipc_program "$(tipc_value train_params trainer train)") || exit 1
exporter=$(tipc_program "$(tipc_value export_params exporter export_model)") || exit 1
inference=$(tipc_program "$(tipc_value infer_params inference infer)") || exit 1
compare=$tipc_dir/compare_results.sh
cd "$tipc_dir" || exit 1

model=$(tipc_value train_params model_name)
[ -n "$model" ] || tipc_die "$params:$(tipc_line train_params model_name): model_name is empty"
nodes=$(tipc_value train_params nodes local)
case $nodes in
  local | netns) ;;
  *) tipc_die "$params:$(tipc_line train_params nodes): nodes:$nodes: expected local (every node's launcher on this machine) or netns (each in a network namespace)" ;;
esac
train_model_name=$(tipc_value train_params train_model_name latest)
repro=$(tipc_value train_params reproducibility_check False)
case $repro in
  True | true) repro=1 ;;
  False | false | "") repro=0 ;;
  *) tipc_die "$params:$(tipc_line train_params reproducibility_check): reproducibility_check:$repro: expected True or False" ;;
esac
gt_file=$(tipc_value infer_params compare_results)
atol=$(tipc_value infer_params atol 1e-3)
rtol=$(tipc_value infer_params rtol 1e-3)

# Alternatives ('|') are allowed where the chain iterates: train flags and gpu_list (one chain
# each), export, and infer flags (one inference run each).
no_alternatives() {  # SECTION KEY...
  local section=$1 key
  shift
  for key in "$@"; do
    [[ $(tipc_value "$section" "$key") != *"|"* ]] ||
      tipc_die "$params:$(tipc_line "$section" "$key"): $key cannot list alternatives ('|')"
  done
}
no_alternatives train_params model_name nodes trainer train_model_name reproducibility_check
mapfile -t train_flags < <(tipc_flag_keys train_params)
mapfile -t export_flags < <(tipc_flag_keys export_params)
mapfile -t infer_flags < <(tipc_flag_keys infer_params)
no_alternatives export_params exporter "${export_flags[@]}"
no_alternatives infer_params inference compare_results atol rtol

# gpu_list entry -> launcher flags. `ips;devices` or `devices`; devices: -1 (one CPU process),
# cpu:N (N CPU processes per node), GPU ids (0,1: one process per GPU) or GPU ids x K (0x2: K
# ranks per GPU sharing it, as on a one-GPU machine: --gpus=0 --nproc_per_node=2).
declare -a node_ips=() device_flags=()
parse_gpu_list() {
  local entry=$1 ips="" devices=$1 n
  n=$(tipc_line train_params gpu_list)
  if [[ $entry == *";"* ]]; then
    ips=${entry%%;*}
    devices=${entry#*;}
  fi
  if [ "$devices" = -1 ]; then
    device_flags=(--nproc_per_node=1)
  elif [[ $devices =~ ^cpu:([1-9][0-9]*)$ ]]; then
    device_flags=(--nproc_per_node="${BASH_REMATCH[1]}")
  elif [[ $devices =~ ^ps:([1-9][0-9]*),([1-9][0-9]*)$ ]]; then
    # Parameter-server mode on one node: S servers and T trainers (the same train program).
    device_flags=(--run_mode=ps --server_num="${BASH_REMATCH[1]}" --trainer_num="${BASH_REMATCH[2]}")
  elif [[ $devices =~ ^[0-9]+(,[0-9]+)*$ ]]; then
    device_flags=(--gpus="$devices")
  elif [[ $devices =~ ^([0-9]+(,[0-9]+)*)x([1-9][0-9]*)$ ]]; then
    local ids=${BASH_REMATCH[1]} per_gpu=${BASH_REMATCH[3]} count
    count=$(($(tr -cd ',' <<<"$ids" | wc -c) + 1))
    device_flags=(--gpus="$ids" --nproc_per_node=$((count * per_gpu)))
  else
    tipc_die "$params:$n: gpu_list entry '$entry': devices '$devices' should be -1 (CPU), cpu:N (N CPU processes per node), ps:S,T (S parameter servers and T trainers), GPU ids like 0,1, or GPU ids x ranks per GPU like 0x2"
  fi
  node_ips=()
  if [ -n "$ips" ]; then
    IFS=',' read -r -a node_ips <<<"$ips"
    local ip
    for ip in "${node_ips[@]}"; do
      [[ $ip =~ ^[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+$ ]] ||
        tipc_die "$params:$n: gpu_list entry '$entry': '$ip' is not an IPv4 address"
    done
  fi
  if [ "$nodes" = netns ] && [ ${#node_ips[@]} -ne 2 ]; then
    tipc_die "$params:$n: nodes:netns needs exactly two node addresses in gpu_list (like 10.232.0.1,10.232.0.2;cpu:1)"
  fi
  return 0
}

# The combinations of a section's alternatives: one line per combination, each a list of
# KEY=VALUE items separated by \x1f. Keys without alternatives are not in the lines.
combinations() {  # SECTION KEY...
  local section=$1 key alt c
  shift
  local -a combos=("") next alts
  for key in "$@"; do
    local value
    value=$(tipc_value "$section" "$key")
    [[ $value == *"|"* ]] || continue
    IFS='|' read -r -a alts <<<"$value"
    next=()
    for c in "${combos[@]}"; do
      for alt in "${alts[@]}"; do next+=("$c$key=$alt"$'\x1f'); done
    done
    combos=("${next[@]}")
  done
  printf '%s\n' "${combos[@]}"
}
# combo_value COMBO SECTION KEY: the key's value in this combination.
combo_value() {
  local combo=$1 section=$2 key=$3 item
  local -a items
  IFS=$'\x1f' read -r -a items <<<"$combo"
  for item in "${items[@]}"; do
    if [ "${item%%=*}" = "$key" ]; then
      # "null" among alternatives (--amp:null|fp16) leaves the flag out, as a whole-line null.
      [ "${item#*=}" = null ] || printf '%s' "${item#*=}"
      return 0
    fi
  done
  tipc_value "$section" "$key"
}
# flag_args COMBO SECTION: --key=value for every set --flag key of the section.
declare -a flag_args_out=()
flag_args() {
  local combo=$1 section=$2 key value
  flag_args_out=()
  while IFS= read -r key; do
    [ -n "$key" ] || continue
    value=$(combo_value "$combo" "$section" "$key")
    [ -n "$value" ] && flag_args_out+=("$key=$value")
  done < <(tipc_flag_keys "$section")
  return 0
}
# tag_of COMBO: a file-name-safe tag for the combination's varying keys.
tag_of() {
  local combo=$1 item tag=""
  local -a items
  IFS=$'\x1f' read -r -a items <<<"$combo"
  for item in "${items[@]}"; do
    [ -n "$item" ] || continue
    local key=${item%%=*} value=${item#*=}
    key=${key#--}
    [ "$key" = gpu_list ] && key=gpus
    tag+="${tag:+_}${key//-/_}_${value}"
  done
  printf '%s' "${tag//[^A-Za-z0-9.,_-]/_}"
}

mapfile -t train_combos < <(combinations train_params gpu_list "${train_flags[@]}")
mapfile -t infer_combos < <(combinations infer_params "${infer_flags[@]}")
IFS='|' read -r -a exports <<<"$(tipc_value export_params export)"
for e in "${exports[@]}"; do
  [ "$e" = rank0 ] || [ "$e" = export_model ] ||
    tipc_die "$params:$(tipc_line export_params export): export:$e: expected rank0, export_model or rank0|export_model"
done
case $train_model_name in
  latest | best | final | model_[0-9]*) ;;
  *) tipc_die "$params:$(tipc_line train_params train_model_name): train_model_name:$train_model_name: expected latest, best, final or model_<epoch>" ;;
esac
for combo in "${train_combos[@]}"; do
  parse_gpu_list "$(combo_value "$combo" train_params gpu_list)"
  data=$(combo_value "$combo" train_params --data-path)
  [ -z "$data" ] || [ -d "$data" ] ||
    tipc_die "$params:$(tipc_line train_params --data-path): --data-path $data: no such folder (in $tipc_dir); run prepare.sh $1 $mode first"
done
# A config that trains on GPUs (gpu_list with GPU ids) or infers with --use-gpu:True needs a
# usable GPU; without one the chain is skipped (77), like nodes:netns without CAP_NET_ADMIN.
needs_gpu=0
for combo in "${train_combos[@]}"; do
  entry=$(combo_value "$combo" train_params gpu_list)
  # `ips;devices` or `devices`; GPU ids are digits (0,1), unlike -1, cpu:N and ps:S,T.
  [[ ${entry##*;} =~ ^[0-9] ]] && needs_gpu=1
done
for combo in "${infer_combos[@]}"; do
  [ "$(combo_value "$combo" infer_params --use-gpu)" = True ] && needs_gpu=1
done
if [ "$needs_gpu" = 1 ] && ! nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
  echo "SKIPPED: $(basename "$params") trains or infers on a GPU, and this machine has none (nvidia-smi -L lists no GPU)"
  exit 77
fi
for combo in "${infer_combos[@]}"; do
  img=$(combo_value "$combo" infer_params --img-path)
  [ -z "$img" ] || [ -e "$img" ] ||
    tipc_die "$params:$(tipc_line infer_params --img-path): --img-path $img: no such file or folder (in $tipc_dir); run prepare.sh $1 $mode first"
done

# netns_setup IP_A IP_B: two namespaces joined by a veth pair, one address each (the approach
# of tests/launch/netns_two_hosts.sh); the interfaces never appear in this machine's namespace.
declare -a netns_names=()
netns_cleanup() {
  local ns
  for ns in "${netns_names[@]}"; do ip netns del "$ns" 2>/dev/null; done
  netns_names=()
}
trap netns_cleanup EXIT
netns_setup() {
  netns_cleanup
  local a=dpar_tipc_a_$$ b=dpar_tipc_b_$$
  ip netns add "$a" && netns_names+=("$a") && ip netns add "$b" && netns_names+=("$b") &&
    ip -n "$a" link add veth_a type veth peer name veth_b netns "$b" &&
    ip -n "$a" addr add "$1/24" dev veth_a && ip -n "$b" addr add "$2/24" dev veth_b &&
    ip -n "$a" link set lo up && ip -n "$b" link set lo up &&
    ip -n "$a" link set veth_a up && ip -n "$b" link set veth_b up
}
# Checked now, so a machine without CAP_NET_ADMIN (or veth support) skips before any work.
if [ "$nodes" = netns ]; then
  command -v ip >/dev/null || { echo "SKIPPED: nodes:netns needs the 'ip' tool (iproute2)"; exit 77; }
  if ! err=$({ netns_setup "${node_ips[0]}" "${node_ips[1]}" &&
    ip netns exec "dpar_tipc_a_$$" true; } 2>&1); then
    netns_names=(dpar_tipc_a_$$ dpar_tipc_b_$$)
    netns_cleanup
    echo "SKIPPED: nodes:netns cannot set up two network namespaces joined by a veth pair" \
      "(needs root or CAP_NET_ADMIN): $err"
    exit 77
  fi
  netns_names=(dpar_tipc_a_$$ dpar_tipc_b_$$)
  netns_cleanup
fi

# ---- run ------------------------------------------------------------------------------------
log_path=$out_root/$model/$mode
results=$log_path/results.log
mkdir -p "$log_path" || tipc_die "cannot create $log_path"
: >"$results"
failures=0
commands=0

# run_logged LOG CMD...: runs CMD (with the per-command timeout), output to LOG; status line.
run_logged() {
  local log=$1 rc
  shift
  if [ "$timeout_s" -gt 0 ]; then
    timeout -k 10 "$timeout_s" "$@" >"$log" 2>&1
  else
    "$@" >"$log" 2>&1
  fi
  rc=$?
  record $rc "$*" "$log"
  return $rc
}
# record RC COMMAND [LOG]: status line; on failure the log's last lines on stderr.
record() {
  local rc=$1 command=$2 log=${3:-}
  commands=$((commands + 1))
  status_check "$rc" "$command" "$results"
  if [ "$rc" -ne 0 ]; then
    failures=$((failures + 1))
    if [ -n "$log" ] && [ -f "$log" ]; then  # without dpar-launch's environment table
      echo "---- last lines of $log (exit status $rc):" >&2
      grep -v '^[|+]' "$log" | tail -n 12 >&2
    fi
  fi
}

# train TRAIN_DIR LOG_PREFIX ARGS...: one training job; one launcher per node, all at once.
train() {
  local dir=$1 log_prefix=$2 rc=0 k
  shift 2
  rm -rf "$dir"
  mkdir -p "$dir"
  local -a args=("$@" --output-dir="$dir" --checkpoint-dir="$dir/checkpoints"
    --loss-log="$dir/loss.log")
  # A port block no concurrent chain or test holds (tests/port_block.sh: claimed with an flock,
  # kept until this script ends).
  local port
  take_port_block || return 1
  if [ ${#node_ips[@]} -le 1 ]; then
    local -a hostflags=()
    [ ${#node_ips[@]} -eq 1 ] && hostflags=(--ips="${node_ips[0]}" --host="${node_ips[0]}")
    run_logged "$log_prefix.log" "$launch" "${hostflags[@]}" "${device_flags[@]}" \
      --start_port="$port" --log_dir="$dir/log" "$trainer" "${args[@]}" || rc=1
  else
    local ips
    ips=$(IFS=,; echo "${node_ips[*]}")
    if [ "$nodes" = netns ] &&
      ! netns_setup "${node_ips[0]}" "${node_ips[1]}" >"${log_prefix}_netns.log" 2>&1; then
      record 1 "set up network namespaces for ${node_ips[*]}" "${log_prefix}_netns.log"
      return 1
    fi
    local -a pids=() cmds=()
    for k in "${!node_ips[@]}"; do
      local -a cmd=("$launch" --ips="$ips" --host="${node_ips[$k]}" "${device_flags[@]}"
        --start_port="$port" --log_dir="$dir/log_node$k" "$trainer" "${args[@]}")
      [ "$nodes" = netns ] && cmd=(ip netns exec "${netns_names[$k]}" "${cmd[@]}")
      [ "$timeout_s" -gt 0 ] && cmd=(timeout -k 10 "$timeout_s" "${cmd[@]}")
      "${cmd[@]}" >"${log_prefix}_node$k.log" 2>&1 &
      pids+=($!)
      cmds+=("${cmd[*]}")
    done
    for k in "${!pids[@]}"; do
      wait "${pids[$k]}"
      local node_rc=$?
      record $node_rc "${cmds[$k]}" "${log_prefix}_node$k.log"
      [ $node_rc -eq 0 ] || rc=1
    done
    [ "$nodes" = netns ] && netns_cleanup
  fi
  return $rc
}

# same_losses DIR_A DIR_B LOG: every rank's loss log of the repeat run is byte-identical.
same_losses() {
  local a=$1 b=$2 log=$3 f rc=0 n=0
  : >"$log"
  for f in "$a"/loss.log*; do
    [ -f "$f" ] || continue
    n=$((n + 1))
    cmp "$f" "$b/$(basename "$f")" >>"$log" 2>&1
    local r=$?
    record $r "cmp $f $b/$(basename "$f")" "$log"
    [ $r -eq 0 ] || rc=1
  done
  if [ $n -eq 0 ]; then
    record 1 "cmp $a/loss.log* $b/loss.log* (the first run wrote no loss log)"
    rc=1
  fi
  return $rc
}

for combo in "${train_combos[@]}"; do
  gpu=$(combo_value "$combo" train_params gpu_list)
  parse_gpu_list "$gpu"
  tag=$(tag_of "$combo")
  [[ $combo == *gpu_list=* ]] || tag="gpus_${gpu//[^A-Za-z0-9.,_-]/_}${tag:+_$tag}"
  flag_args "$combo" train_params
  train_args=(--model="$model" "${flag_args_out[@]}")
  train_dir=$log_path/train_$tag
  echo "== $model, $mode, gpu_list $gpu: training"
  if ! train "$train_dir" "$log_path/train_$tag" "${train_args[@]}"; then
    echo "training failed; skipping export and inference for gpu_list $gpu" >&2
    continue
  fi
  if [ $repro -eq 1 ]; then
    echo "== reproducibility: the same training again"
    train "${train_dir}_repeat" "$log_path/train_${tag}_repeat" "${train_args[@]}" &&
      same_losses "$train_dir" "${train_dir}_repeat" "$log_path/reproducibility_$tag.log"
  fi

  infer_logs=()
  for e in "${exports[@]}"; do
    echo "== export: $e"
    if [ "$e" = rank0 ]; then
      model_dir=$train_dir/inference
      if ! test -s "$model_dir/inference.onnx"; then
        record 1 "test -s $model_dir/inference.onnx (rank 0 exports it at the end of training)"
        continue
      fi
      record 0 "test -s $model_dir/inference.onnx"
    else
      case $train_model_name in
        final) weights=$train_dir/$model.safetensors ;;
        *) weights=$train_dir/checkpoints/$train_model_name.ckpt ;;
      esac
      model_dir=$log_path/export_$tag/inference
      rm -rf "$model_dir"
      flag_args "" export_params
      run_logged "$log_path/export_$tag.log" "$exporter" --model="$model" --pretrained="$weights" \
        --save-inference-dir="$model_dir" "${flag_args_out[@]}" || continue
    fi
    echo "== inference: $e model, ${#infer_combos[@]} configuration(s)"
    for icombo in "${infer_combos[@]}"; do
      flag_args "$icombo" infer_params
      itag=$(tag_of "$icombo")
      log=$log_path/infer_${tag}_${e}${itag:+_$itag}.log
      run_logged "$log" "$inference" --model-dir="$model_dir" "${flag_args_out[@]}" &&
        infer_logs+=("$log")
    done
  done

  if [ -n "$gt_file" ] && [ ${#infer_logs[@]} -gt 0 ]; then
    echo "== compare_results against $gt_file"
    run_logged "$log_path/compare_$tag.log" "$compare" --gt="$gt_file" --atol="$atol" \
      --rtol="$rtol" "${infer_logs[@]}" && cat "$log_path/compare_$tag.log"
  fi
done

echo "$TIPC_PROG: $commands command(s), $failures failed; status lines in $results"
[ $failures -eq 0 ]
