set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
[ -d /tmp/llama8b ] || python3 tools/random_model.py llama3-8b /tmp/llama8b --dtype bfloat16 --tokenizer-from .gpuwheels/tok >/dev/null 2>&1
python3 .gpuwheels/tok/probe_stage.py 2>&1 | grep "ranks 2"
for r in 1 2; do for pl in 0 1; do PAYLOAD=$pl timeout 200 python3 .gpuwheels/tok/probe_pingpong.py 1,16,64 2>&1 | grep pingpong; done; done
L=$(dirname $(which python3))/mlx.launch
echo '[{"ssh": "127.0.0.1", "ips": ["127.0.0.1"]}, {"ssh": "127.0.0.1", "ips": ["127.0.0.1"]}]' > /tmp/h2.json
timeout 150 $L --backend ring --hostfile /tmp/h2.json --starting-port 24900 -- python3 tools/bench_steps.py \
  --model /tmp/llama8b --streams 1,16,64 --trace $OUT/trace-pp-64.json < <(while sleep 1; do echo; done) 2>&1 | grep -v "Socket\|WARN\|INFO"
