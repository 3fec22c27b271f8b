#!/usr/bin/env bash
# The documentation stays true: README.md and every docs/*.md page, checked against the binary
# and the tree. For every fenced sh block:
#   - a titan command (`./titan`, `titan`, `./run_train.sh`, after mpirun/srun/&&) names only
#     flags that exist:
#     `titan --help` and `--help-config` for training, `titan COMMAND --help` for a command
#     (FLUX's sampler prints its own usage for a FLUX checkpoint, made here in seconds);
#   - every training command parses as written: it runs with --print-config appended (or as it
#     is, when it only plans: --estimate, --print-schedule, --help...), so a key, an enum value
#     or a flag that titan refuses fails the test;
#   - a python script of scripts/ names only the flags its own --help lists;
#   - `make` names only targets of the Makefile and variables it reads;
#   - every configs/, scripts/, docs/ and tests/ path a command names exists.
# Every yaml block's keys exist (--help-config); every relative link of a page resolves, to a
# heading that exists when it has an #anchor; every docs/*.md page is linked from README.md;
# README.md is at most 210 lines (.ci/run refuses any file naming a folder beside the clone).
# A few commands run for real: --help, --estimate, FLUX sampling.
source "$(dirname "$0")/lib.sh"

# A FLUX checkpoint (one step of flux-digits on the digits shards), for the sampler's usage.
/usr/bin/python3 scripts/flux_preprocess.py --digits --out "$SCRATCH/digits" >/dev/null
$TITAN --config configs/flux_digits.yaml --training.dataset_path "$SCRATCH/digits" \
  --training.steps 1 --checkpoint.interval 1 --job.dump_folder "$SCRATCH/flux" >/dev/null
FLUX_CKPT=$SCRATCH/flux/checkpoint/step-1.h5
[ -f "$FLUX_CKPT" ] || fail "no FLUX checkpoint at $FLUX_CKPT"
# ... and its sampler run as flux.md writes it, on two prompts of the digits' captions.
$TITAN generate --checkpoint "$FLUX_CKPT" --data "$SCRATCH/digits" --prompt "a handwritten digit 3" \
  --prompt "a handwritten digit 7" --samples 2 --steps 2 --out "$SCRATCH/grid.png" >/dev/null \
  2>"$SCRATCH/sample.log" || fail "FLUX sampling: $(tail -1 "$SCRATCH/sample.log")"
[ -s "$SCRATCH/grid.png" ] || fail "titan generate wrote no FLUX grid"
echo "ok: FLUX checkpoint and its sampler"

# The Makefile's explicit targets, from make's own database (nothing is built).
{ make -pRrq -f Makefile : 2>/dev/null || true; } | awk -F: '/^[a-zA-Z0-9][^$#\t=]*:([^=]|$)/ {print $1}' |
  sort -u >"$SCRATCH/make_targets.txt"
grep -qx run "$SCRATCH/make_targets.txt" || fail "could not read the Makefile's targets"

TITAN=$TITAN FLUX_CKPT=$FLUX_CKPT TARGETS=$SCRATCH/make_targets.txt $PY - <<'PY' ||
import glob, os, re, shlex, subprocess, sys

TITAN = os.environ["TITAN"]
TARGETS = set(open(os.environ["TARGETS"]).read().split())
PAGES = ["README.md"] + sorted(glob.glob("docs/*.md"))
errors = []
ran = 0
# Names the pages cite as what titan does not have (torchtitan's older spelling).
NOT_KEYS = {"float8.enable_float8_linear"}


def run(argv, ok=(0,)):
    r = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    if r.returncode not in ok:
        return None, (r.stderr or r.stdout).strip().splitlines()[-1:] or [f"exit {r.returncode}"]
    return r.stdout + r.stderr, None


def help_flags(argv):
    out, err = run(argv)
    if err:
        sys.exit(f"{' '.join(argv)}: {err[0]}")
    return set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*|-[a-z])\b", out))


# What exists: training flags and config keys, each command's flags.
train_flags = help_flags([TITAN, "--help"]) - {"--section"}
out, _ = run([TITAN, "--help-config"])
keys = set(re.findall(r"^  (--[a-z_0-9]+\.[a-z_0-9]+):", out, re.M))
assert len(keys) > 100, "too few keys in --help-config"
sections = {k[2:].split(".")[0] for k in keys}
commands = {
    ("generate",): help_flags([TITAN, "generate", "--help"])
    | help_flags([TITAN, "generate", "--checkpoint", os.environ["FLUX_CKPT"], "--help"]),
    ("convert",): help_flags([TITAN, "convert", "--help"]),
    ("tokenize",): help_flags([TITAN, "tokenize", "--help"]),
    ("tokenizer", "train"): help_flags([TITAN, "tokenizer", "train", "--help"]),
}
for flags in commands.values():
    flags |= {"--help", "-h"}
script_flags = {}


def where(page, line):
    return f"{page}:{line}"


def check_path(tok, at):
    tok = tok.split("=", 1)[-1]
    m = re.match(r"^(?:\./)?((?:configs|scripts|docs|tests)/[^\s*\[\]]*)", tok)
    if not m:
        return
    path = m.group(1).rstrip("/,)")
    if path and not os.path.exists(path):
        errors.append(f"{at}: {path} does not exist")


def check_titan(args, at, line, execute):
    """args: the tokens after the titan binary."""
    global ran
    sub = next((c for c in commands if tuple(args[: len(c)]) == c), None)
    allowed = commands[sub] if sub else train_flags | keys
    for a in args[len(sub) if sub else 0:]:
        if a.startswith("-") and not re.match(r"^-?\d", a):
            flag = a.split("=", 1)[0]
            if flag not in allowed:
                errors.append(f"{at}: `{line}` names {flag}, which titan{' ' + ' '.join(sub) if sub else ''} does not have")
    if sub or not execute:
        return
    # A training command parses as written: planning commands run, the rest print their config.
    plan = {"--estimate", "--print-schedule", "--help", "-h", "--help-config", "--print-config"}
    argv = [TITAN] + args + ([] if plan & set(args) else ["--print-config"])
    _, err = run(argv)
    ran += 1
    if err:
        errors.append(f"{at}: `{line}` fails: {err[0]}")


def check_script(cmd, args, at, line):
    path = cmd.lstrip("./")
    if path not in script_flags:
        first = open(path).readline() if os.path.isfile(path) else ""
        script_flags[path] = (help_flags(["/usr/bin/python3", path, "--help"]) | {"--help", "-h"}
                              if path.endswith(".py") or "python" in first else None)
    flags = script_flags[path]
    if path == "scripts/run_default.sh":  # passes its arguments to titan
        flags = train_flags | keys
    for a in args if flags else []:
        if a.startswith("-") and not re.match(r"^-?\d", a) and a.split("=", 1)[0] not in flags:
            errors.append(f"{at}: `{line}` names {a.split('=', 1)[0]}, which {path} does not have")


def check_make(args, at, line):
    makefile = open("Makefile").read()
    for a in args:
        if a.startswith("-"):
            continue
        if "=" in a:
            var = a.split("=", 1)[0]
            if not re.search(rf"\b{var}\b", makefile):
                errors.append(f"{at}: `{line}`: the Makefile reads no {var}")
        elif a not in TARGETS:
            errors.append(f"{at}: `{line}`: the Makefile has no target {a}")


def check_command(tokens, at, line, execute=True):
    while tokens and re.match(r"^[A-Z_]+=", tokens[0]):  # VAR=value prefixes
        tokens = tokens[1:]
    if not tokens:
        return
    for t in tokens:
        check_path(t, at)
    cmd, args = tokens[0], tokens[1:]
    if cmd in ("mpirun", "srun"):  # the launcher's own options, up to the program
        i = next((i for i, t in enumerate(args) if t.endswith("titan")), None)
        if i is None:
            errors.append(f"{at}: `{line}`: {cmd} runs no titan")
            return
        cmd, args = args[i], args[i + 1:]
    if cmd in ("bash", "/usr/bin/python3", "python3") and args:
        cmd, args = args[0], args[1:]
    # ./run_train.sh passes its arguments to titan under mpirun
    if cmd in ("./titan", "titan", "./run_train.sh") or cmd.endswith("/titan"):
        check_titan(args, at, line, execute)
    elif cmd == "make":
        check_make(args, at, line)
    elif re.match(r"^(\./)?scripts/", cmd) and os.path.isfile(cmd):
        check_script(cmd, args, at, line)


def fenced(page):
    """(language, first line number, text) of each fenced block."""
    lines, blocks, i = open(page).read().split("\n"), [], 0
    while i < len(lines):
        m = re.match(r"^```(\w*)\s*$", lines[i])
        if m:
            j = i + 1
            while j < len(lines) and not lines[j].startswith("```"):
                j += 1
            blocks.append((m.group(1), i + 2, "\n".join(lines[i + 1:j])))
            i = j
        i += 1
    return blocks


def slug(heading):  # GitHub's anchor for a heading
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


anchors = {}
for page in PAGES:
    text = re.sub(r"^```.*?^```", "", open(page).read(), flags=re.M | re.S)
    anchors[page] = {slug(h) for h in re.findall(r"^#+ (.*)$", text, re.M)}

commands_seen = 0
for page in PAGES:
    for lang, first, body in fenced(page):
        if lang in ("sh", "bash"):
            logical = []  # (line number, one shell line with its continuations joined)
            for n, raw in enumerate(body.split("\n")):
                if logical and logical[-1][1].endswith("\\"):
                    logical[-1] = (logical[-1][0], logical[-1][1][:-1] + " " + raw.strip())
                else:
                    logical.append((first + n, raw))
            for n, raw in logical:
                if raw.startswith("#") or not raw.strip():  # a script's comments, #SBATCH lines
                    continue
                try:
                    tokens = shlex.split(raw, comments=True)
                except ValueError as e:
                    errors.append(f"{where(page, n)}: `{raw}`: {e}")
                    continue
                # one command per && ; || & (a line of a sh block is one shell line)
                cmd = []
                for t in tokens + ["&&"]:
                    if t in ("&&", ";", "||", "&"):
                        check_command(cmd, where(page, n), " ".join(raw.split()))
                        commands_seen += 1
                        cmd = []
                    else:
                        cmd.append(t)
        elif lang == "yaml":
            section = None
            for n, raw in enumerate(body.split("\n")):
                m = re.match(r"^([a-z_0-9]+):\s*(#.*)?$", raw)
                if m:
                    section = m.group(1)
                    if section not in sections:
                        errors.append(f"{where(page, first + n)}: no config section {section}")
                    continue
                m = re.match(r"^  ([a-z_0-9]+):", raw)
                if m and f"--{section}.{m.group(1)}" not in keys:
                    errors.append(f"{where(page, first + n)}: no config key {section}.{m.group(1)}")
    # Code spans in the prose: a command's flags (not run: they hold placeholders), a config key.
    text = re.sub(r"^```.*?^```", "", open(page).read(), flags=re.M | re.S)
    for span in re.findall(r"`([^`]+)`", text):
        span = " ".join(span.split())
        if re.match(r"^(\./)?titan |^(bash |/usr/bin/python3 )?scripts/|^make ", span):
            check_command(re.sub(r"[\[\]]|\.\.\.", " ", span).split(), page, span, execute=False)
            commands_seen += 1
        for m in re.finditer(r"(?<![\w./-])(?:--)?([a-z_0-9]+)\.([a-z_0-9]+)(?![./*\w])", span):
            name = f"{m.group(1)}.{m.group(2)}"
            if (m.group(1) in sections and f"--{name}" not in keys and name not in NOT_KEYS
                    and m.group(2) not in ("json", "jsonl", "png", "safetensors", "h5", "yaml")):
                errors.append(f"{page}: `{span}` names {name}, which --help-config does not list")
    # links: relative files exist, anchors name a heading of their page
    text = re.sub(r"^```.*?^```", "", open(page).read(), flags=re.M | re.S)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"^[a-z]+://", target):
            continue
        path, _, anchor = target.partition("#")
        full = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
        if not os.path.exists(full):
            errors.append(f"{page}: link to {target}: {full} does not exist")
        elif anchor and full in anchors and anchor not in anchors[full]:
            errors.append(f"{page}: link to {target}: {full} has no heading #{anchor}")

readme = open("README.md").read()
for page in glob.glob("docs/*.md"):
    if f"({page})" not in readme:
        errors.append(f"README.md does not link {page}")
n_lines = readme.count("\n")
if n_lines > 210:
    errors.append(f"README.md has {n_lines} lines, more than 210")

if errors:
    print("\n".join(errors), file=sys.stderr)
    sys.exit(1)
print(f"ok: {len(PAGES)} pages, {commands_seen} commands ({ran} titan commands run), "
      f"every flag, key, path, link and make target exists; README.md {n_lines} lines")
PY
  fail "the documentation says what is not true (above)"

# Cheap commands of the README, for real: the help, the 405B plan on 2048 ranks.
$TITAN --help | grep -q "^usage: titan --config" || fail "titan --help"
$TITAN --estimate --config configs/llama3_405b.yaml --world-size 2048 >"$SCRATCH/estimate.txt"
grep -q "^estimate: llama3 405B on 2048 ranks" "$SCRATCH/estimate.txt" ||
  fail "--estimate: $(head -1 "$SCRATCH/estimate.txt")"
echo "ok: --help, --estimate"
