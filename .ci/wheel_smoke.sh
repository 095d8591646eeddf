#!/usr/bin/env bash
# CI: kgrad as users get it. Builds the wheel and the sdist (`python -m build`),
# installs the wheel into a fresh virtual environment, and from a folder outside
# the checkout checks that `import kgrad` finds the installed package, that
# `kgrad --version` and `kgrad demo --epochs 1` run, and that
# `tensorboard --logdir` serves the kgrad tab's JS and CSS.
#
# Usage: .ci/wheel_smoke.sh   (with a Python that has `build`: pip install build)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d)"
tensorboard_pid=""
cleanup() {
    if [ -n "$tensorboard_pid" ]; then
        kill "$tensorboard_pid" 2>/dev/null || true
        wait "$tensorboard_pid" 2>/dev/null || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "wheel smoke test: $*" >&2; exit 1; }

echo "== python -m build (wheel and sdist)"
python -m build --outdir "$work/dist" "$root" >"$work/build.log" 2>&1 || { cat "$work/build.log"; fail "python -m build failed"; }
wheels=("$work"/dist/kgrad-*-py3-none-any.whl)
sdists=("$work"/dist/kgrad-*.tar.gz)
[ -f "${wheels[0]}" ] || fail "no wheel in $work/dist: $(ls "$work/dist")"
[ -f "${sdists[0]}" ] || fail "no sdist in $work/dist: $(ls "$work/dist")"
version="$(basename "${wheels[0]}" | cut -d- -f2)"

echo "== a fresh virtual environment with $(basename "${wheels[0]}")"
python3 -m venv "$work/venv"
"$work/venv/bin/python" -m pip install --quiet "${wheels[0]}"

# From here on, nothing of the checkout is on the path.
cd "$work"
unset PYTHONPATH
export PATH="$work/venv/bin:$PATH"
export TF_CPP_MIN_LOG_LEVEL=3

echo "== import kgrad"
location="$(python -c "import kgrad; print(kgrad.__file__)")"
case "$location" in
    "$work/venv/"*) ;;
    *) fail "import kgrad found $location, not the installed wheel under $work/venv" ;;
esac

echo "== kgrad --version"
reported="$(kgrad --version)"
[ "$reported" = "kgrad $version" ] || fail "kgrad --version printed '$reported', expected 'kgrad $version' (the wheel's version)"

echo "== kgrad demo --epochs 1"
kgrad demo --epochs 1 --log-dir "$work/logs"
[ -d "$work/logs/sigmoid_deep/kgrad" ] || fail "kgrad demo wrote no $work/logs/sigmoid_deep/kgrad"

echo "== tensorboard --logdir serves the kgrad tab"
port="$(python -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")"
tensorboard --logdir "$work/logs" --host 127.0.0.1 --port "$port" >"$work/tensorboard.log" 2>&1 &
tensorboard_pid=$!
static="$root/kgrad/dashboard/static"
# Every JS and CSS file of the checkout's tab, served byte for byte from the installed
# package, and the tab listed among TensorBoard's plugins; up to 90 s for it to start.
python - "$port" "$static" <<'EOF' || { cat "$work/tensorboard.log"; fail "tensorboard did not serve the kgrad tab"; }
import json, os, sys, time, urllib.error, urllib.request

port, static = sys.argv[1], sys.argv[2]
base = f"http://127.0.0.1:{port}"
names = sorted(name for name in os.listdir(static) if name.endswith((".js", ".css")))
assert any(n.endswith(".js") for n in names) and any(n.endswith(".css") for n in names), names


def get(path):
    with urllib.request.urlopen(base + path, timeout=10) as answer:
        return answer.status, answer.headers.get("Content-Type", ""), answer.read()


deadline = time.monotonic() + 90
while True:
    try:
        plugins = json.loads(get("/data/plugins_listing")[2])
        break
    except (urllib.error.URLError, ConnectionError):
        if time.monotonic() > deadline:
            sys.exit(f"no answer from {base} after 90 s")
        time.sleep(1)
assert "kgrad" in plugins, f"no kgrad plugin in /data/plugins_listing: {sorted(plugins)}"
for name in names:
    status, kind, body = get(f"/data/plugin/kgrad/{name}")
    with open(os.path.join(static, name), "rb") as file:
        expected = file.read()
    wanted = "text/css" if name.endswith(".css") else "javascript"
    assert status == 200 and wanted in kind, (name, status, kind)
    assert body == expected, f"{name}: served {len(body)} bytes, the checkout has {len(expected)}"
    print(f"served /data/plugin/kgrad/{name} ({kind}, {len(body)} bytes)")
EOF

echo "wheel smoke test: OK (kgrad $version)"
