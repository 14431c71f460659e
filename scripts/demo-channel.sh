#!/usr/bin/env bash
# The README's walk-through "A payment-channel node", run and checked: a
# development chain, three nodes, fund, connect, open, pay, HTLC, a payment
# through a hop to an invoice, close. The
# lines between the README markers below are the README's commands, the same
# text line for line (checked first), plus `check`, `wait_until` and
# `remember` lines that verify every balance on the way.
#
#   bash scripts/demo-channel.sh                                # runs `cargo run --release` as the README does
#   POTLUCK=target/debug/potluck bash scripts/demo-channel.sh   # any built binary (CI: the tests' debug build)
#
# It works in a fresh temporary directory and needs the README's ports
# (127.0.0.1:18443, 9735, 9736, 9745, 9746, 9755, 9756) free.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SELF="$ROOT/scripts/demo-channel.sh"
# A path to a binary is made absolute: the walk-through runs in a temporary directory.
if [[ -n "${POTLUCK:-}" && -x "$POTLUCK" ]]; then
  POTLUCK=$(realpath "$POTLUCK")
fi
POTLUCK=${POTLUCK:-cargo run --release -q --manifest-path $ROOT/Cargo.toml --}

fail() {
  echo "demo-channel: FAILED: $*" >&2
  exit 1
}

# 1. The commands below are the README's, so that the README never drifts.
readme_commands() {
  awk '/<!-- demo-channel.sh: begin -->/ {on = 1; next}
       /<!-- demo-channel.sh: end -->/ {on = 0}
       on && !/^```/ && !/^potluck\(\) \{/ {print}' "$ROOT/README.md"
}
script_commands() {
  awk '/^# >>> README$/ {on = 1; next}
       /^# <<< README$/ {on = 0}
       on && !/^(check|wait_until|remember) / {print}' "$SELF"
}
[[ -n "$(readme_commands)" ]] || fail "README.md has no block between the demo-channel.sh markers"
if ! diff <(readme_commands) <(script_commands) >&2; then
  fail "the commands differ from README.md's walk-through (diff above: < README, > script)"
fi

for port in 18443 9735 9736 9745 9746 9755 9756; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    fail "port $port is in use; the walk-through needs it"
  fi
done

WORK=$(mktemp -d)
cd "$WORK"
# Each background job gets its own process group, so cleanup ends it with its children.
set -m
cleanup() {
  local status=$?
  for pid in $(jobs -p); do
    kill -- "-$pid" 2>/dev/null || true
  done
  wait 2>/dev/null || true
  rm -rf "$WORK"
  return $status
}
trap cleanup EXIT

potluck() { $POTLUCK "$@"; }
# The processes' own logs: warnings only, so that the output is the walk-through's.
export POTLUCK_LOG=${POTLUCK_LOG:-warn}

# check EXPECTED COMMAND…: the command prints exactly EXPECTED.
check() {
  local want=$1 got
  shift
  got=$("$@") || fail "$* failed"
  [[ "$got" == "$want" ]] || fail "$* printed '$got', expected '$want'"
  echo "  ok: ${*: -2} = $want"
}

# wait_until EXPECTED COMMAND…: the command prints EXPECTED within 30 s (the node sees blocks every 250 ms).
wait_until() {
  local want=$1 got="" i
  shift
  for i in $(seq 300); do
    got=$("$@" 2>/dev/null) || true
    if [[ "$got" == "$want" ]]; then
      echo "  ok: ${*: -2} = $want"
      return 0
    fi
    sleep 0.1
  done
  fail "$* printed '$got', expected '$want' within 30 s"
}

# remember NAME COMMAND…: keeps what the command prints, for a later check.
remember() {
  local name=$1
  shift
  printf -v "$name" '%s' "$("$@")"
}

# >>> README
potluck chain --block-interval 0 &                           # one development chain for all nodes, JSON-RPC on 127.0.0.1:18443
potluck cli --chain --wait getblockcount                     # waits until it answers; its files are in ./potluck-data/chain
CHAIN="--bitcoind-url http://127.0.0.1:18443/ --bitcoind-cookie ./potluck-data/chain/.cookie"
potluck node --data-dir ./a --listen 127.0.0.1:9735 --rpc-bind 127.0.0.1:9736 $CHAIN &
potluck node --data-dir ./b --listen 127.0.0.1:9745 --rpc-bind 127.0.0.1:9746 $CHAIN &
A=$(potluck cli --data-dir ./a --wait --get node_id getinfo)  # a node writes its control URL into its data directory
B=$(potluck cli --data-dir ./b --wait --get node_id getinfo)
check 66 eval 'printf %s "$A" | wc -c | tr -d " "'
check "$(cat ./b/control_url)" echo "http://127.0.0.1:9746/"
BURN=bcrt1qqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqdku202              # nobody holds this address's key: block rewards go there
potluck cli --chain sendtoaddress $(potluck cli --data-dir ./a --get address newaddr) 0.01  # the faucet: 1,000,000 sat to A
potluck cli --chain generatetoaddress 1 $BURN                # mine it
wait_until 1000000 potluck cli --data-dir ./a --get total_sat listfunds
potluck cli --data-dir ./a listfunds                         # total_sat 1000000 (once A has seen the block)
potluck cli --data-dir ./a connect 127.0.0.1:9745
potluck cli --data-dir ./a open $B 500000                    # A funds a 500,000-sat channel: the anchor is broadcast
potluck cli --chain generatetoaddress 1 $BURN                # the anchor confirms: the channel goes live (state normal)
wait_until normal potluck cli --data-dir ./a --get channels.0.state listchannels
wait_until normal potluck cli --data-dir ./b --get channels.0.state listchannels
check 490000000 potluck cli --data-dir ./a --get channels.0.ours.spendable_msat listchannels
wait_until 1 eval 'potluck cli --data-dir ./a --get outputs listfunds | grep -c "\"amount_sat\""'
remember A_CHANGE potluck cli --data-dir ./a --get total_sat listfunds
potluck cli --data-dir ./a pay $B 1000000                    # 1,000 sat (payments are in msat)
check 1000000 potluck cli --data-dir ./b --get channels.0.ours.balance_msat listchannels
check 1000000 potluck cli --data-dir ./b --get channels.0.ours.fee_share_msat listchannels
check 0 potluck cli --data-dir ./b --get channels.0.ours.spendable_msat listchannels
check 0 potluck cli --data-dir ./b --get channels.0.our_msat listchannels
check 499000000 potluck cli --data-dir ./a --get channels.0.ours.balance_msat listchannels
check 9000000 potluck cli --data-dir ./a --get channels.0.ours.fee_share_msat listchannels
check 490000000 potluck cli --data-dir ./a --get channels.0.ours.spendable_msat listchannels
check 0 potluck cli --data-dir ./a --get channels.0.theirs.spendable_msat listchannels
potluck cli --data-dir ./b listchannels                      # B owns 1,000,000 msat, all of it its fee share: spendable 0
potluck cli --data-dir ./a pay $B 20000000                   # 20,000 sat more: B's fee share is full, 16,000 sat spendable
check 21000000 potluck cli --data-dir ./b --get channels.0.ours.balance_msat listchannels
check 5000000 potluck cli --data-dir ./b --get channels.0.ours.fee_share_msat listchannels
check 16000000 potluck cli --data-dir ./b --get channels.0.ours.spendable_msat listchannels
check 474000000 potluck cli --data-dir ./a --get channels.0.ours.spendable_msat listchannels
R=0101010101010101010101010101010101010101010101010101010101010101       # B's secret
R_HASH=72cd6e8422c407fb6d098690f1130b7ded7ec2f7f5e1d30bd9d521f015363793  # SHA256 of R's 32 bytes
check "$R_HASH" eval 'printf "\x01%.0s" $(seq 32) | sha256sum | cut -d" " -f1'
H=$(potluck cli --data-dir ./a --get block_height getinfo)
potluck cli --data-dir ./a newhtlc $B 50000000 $R_HASH $((H + 100))  # 50,000 sat for B if it shows R within 100 blocks
check in potluck cli --data-dir ./b --get channels.0.htlcs.0.direction listchannels
check 50000000 potluck cli --data-dir ./a --get channels.0.ours.htlc_msat listchannels
check 429000000 potluck cli --data-dir ./a --get channels.0.ours.balance_msat listchannels
potluck cli --data-dir ./b fulfillhtlc $A $R                 # B shows R: the 50,000 sat are B's (71,000 sat in all)
check 71000000 potluck cli --data-dir ./b --get channels.0.ours.balance_msat listchannels
check 0 potluck cli --data-dir ./a --get channels.0.ours.htlc_msat listchannels
potluck node --data-dir ./c --listen 127.0.0.1:9755 --rpc-bind 127.0.0.1:9756 $CHAIN &  # a third node: A pays C through B
C=$(potluck cli --data-dir ./c --wait --get node_id getinfo)
potluck cli --chain sendtoaddress $(potluck cli --data-dir ./b --get address newaddr) 0.01  # 1,000,000 sat to B for a channel to C
potluck cli --chain generatetoaddress 1 $BURN
wait_until 1000000 potluck cli --data-dir ./b --get total_sat listfunds
potluck cli --data-dir ./b connect 127.0.0.1:9755
potluck cli --data-dir ./b open $C 500000
potluck cli --chain generatetoaddress 1 $BURN
wait_until normal potluck cli --data-dir ./b --get channels.1.state listchannels
wait_until normal potluck cli --data-dir ./c --get channels.0.state listchannels
wait_until 1 eval 'potluck cli --data-dir ./b --get outputs listfunds | grep -c "\"amount_sat\""'
remember B_CHANGE potluck cli --data-dir ./b --get total_sat listfunds
RH=$(potluck cli --data-dir ./c --get r_hash invoice 100000000 coffee)  # C asks 100,000 sat: its invoice's R stays with C
potluck cli --data-dir ./a pay --route $B,$C $RH 100000000   # A offers B 100,002 sat: C's 100,000 plus B's fee (1,000 msat + 10 millionths); answers payment.status paid once B passed R back (help pay: a fee retry)
potluck cli --data-dir ./c --get status waitinvoice coffee   # paid: C fulfilled, B took R back to A
wait_until fulfilled potluck cli --data-dir ./b --get forwards.0.state listforwards
check 2000 potluck cli --data-dir ./b --get forwards.0.fee_msat listforwards
check 100000000 potluck cli --data-dir ./c --get channels.0.ours.balance_msat listchannels
check 171002000 potluck cli --data-dir ./b --get channels.0.ours.balance_msat listchannels
check 328998000 potluck cli --data-dir ./a --get channels.0.ours.balance_msat listchannels
potluck cli --data-dir ./b listforwards                      # in_msat 100002000, out_msat 100000000, fee_msat 2000: B earned 2 sat
potluck cli --data-dir ./a close $B                          # cooperative close (or: close $B force, unilateral)
potluck cli --chain generatetoaddress 1 $BURN                # the close confirms
wait_until $((B_CHANGE + 170916)) potluck cli --data-dir ./b --get total_sat listfunds
wait_until $((A_CHANGE + 328912)) potluck cli --data-dir ./a --get total_sat listfunds
wait_until closed potluck cli --data-dir ./a --get channels.0.state listchannels
potluck cli --data-dir ./b listfunds                         # B's change, plus 171,002 sat less its half of the 172-sat close fee
potluck cli --data-dir ./a stop; potluck cli --data-dir ./b stop; potluck cli --data-dir ./c stop; potluck cli --chain stop
# <<< README

# Every process stopped by itself and took its control URL with it.
for i in $(seq 100); do
  [[ -z "$(jobs -pr)" ]] && break
  sleep 0.1
done
[[ -z "$(jobs -pr)" ]] || fail "a process did not stop"
for dir in ./a ./b ./c ./potluck-data/chain; do
  [[ ! -e "$dir/control_url" ]] || fail "$dir/control_url is still there after stop"
done
echo "demo-channel: ok (A kept $A_CHANGE + 328912 sat, B $B_CHANGE + 170916 sat, C 100,000 sat in its channel)"
