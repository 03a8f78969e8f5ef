set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
[ -d /tmp/llama8b ] || python3 tools/random_model.py llama3-8b /tmp/llama8b --dtype bfloat16 --tokenizer-from .gpuwheels/tok >/dev/null 2>&1
L=$(dirname $(which python3))/mlx.launch
echo '[{"ssh": "127.0.0.1", "ips": ["127.0.0.1"]}]' > /tmp/h1.json
echo '[{"ssh": "127.0.0.1", "ips": ["127.0.0.1"]}, {"ssh": "127.0.0.1", "ips": ["127.0.0.1"]}]' > /tmp/h2.json
p=25000
run() { p=$((p+20)); timeout 150 $L --backend ring --hostfile /tmp/h$1.json --starting-port $p -- python3 $2 \
  --model /tmp/llama8b "${@:3}" < <(while sleep 1; do echo; done) 2>&1 | grep -v "Socket\|WARN\|INFO"; }
echo "== 1 rank"; run 1 tools/bench_steps.py --streams 1,16,64
for r in 1 2; do
  echo "== round $r: 2 ranks, default (GPU waits in a kernel)"; run 2 tools/bench_steps.py --streams 1,16,64 --trace $OUT/trace-default-r$r.json
  echo "== round $r: 2 ranks, host waits"; run 2 .gpuwheels/tok/bench_steps_hostwait.py --streams 1,16,64 --trace $OUT/trace-hostwait-r$r.json
done
