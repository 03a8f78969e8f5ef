set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
[ -d /tmp/llama8b ] || python3 tools/random_model.py llama3-8b /tmp/llama8b --dtype bfloat16 --tokenizer-from .gpuwheels/tok >/dev/null 2>&1
python3 .gpuwheels/tok/probe_streams.py 2>&1 | grep rows
L=$(dirname $(which python3))/mlx.launch
echo '[{"ssh": "127.0.0.1", "ips": ["127.0.0.1"]}, {"ssh": "127.0.0.1", "ips": ["127.0.0.1"]}]' > /tmp/h2.json
p=26000
for r in 1 2 3; do for v in "SPLIT=0 WAITPAY=0" "SPLIT=1 WAITPAY=1"; do p=$((p+20)); echo "== round $r $v"
  env $v timeout 120 $L --backend ring --hostfile /tmp/h2.json --starting-port $p -- python3 .gpuwheels/tok/probe_ring.py /tmp/llama8b 1,64 \
    < <(while sleep 1; do echo; done) 2>&1 | grep "streams\|x6"
done; done
