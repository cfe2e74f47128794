# Sourced by every test script that starts jobs on loopback ports: `take_port_block` sets $port
# to the first of 20 ports that no other test script of this machine holds while this shell
# (or a process it started) lives.
#
# A random block alone collided now and then under ctest -j (two scripts drew the same block,
# and the second job's store found its port in use), so each block is also claimed with an
# flock on a file named after it; a script that finds the lock taken draws again. The lock is
# on a descriptor this shell keeps open, so it is released when the shell and every process
# that inherited the descriptor (a launcher, its workers) have exited. Blocks stay below 32768,
# the start of Linux's ephemeral range, so no outgoing connection's local port lands in one.
take_port_block() {
  local dir=${TMPDIR:-/tmp}/dpar-test-ports attempt candidate
  mkdir -p "$dir"
  for ((attempt = 0; attempt < 200; attempt++)); do
    candidate=$((20000 + (RANDOM % 638) * 20)) # 20000 .. 32740, 20 ports each
    exec {port_block_fd}>"$dir/$candidate.lock"
    if flock -n "$port_block_fd"; then
      port=$candidate
      return 0
    fi
    exec {port_block_fd}>&-
  done
  echo "take_port_block: no free port block in $dir after 200 draws" >&2
  return 1
}
