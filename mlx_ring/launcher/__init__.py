"""The launcher behind `./launch.sh`: the environment, the supervisor that keeps the ring running,
and the commands a user types. The same Python on macOS and Linux; `launch.sh` only finds uv."""
