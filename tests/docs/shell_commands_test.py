#!/usr/bin/env python3
"""Every shell command of README.md and docs/*.md (their ```sh blocks), checked against the build.

For each command:
- a program named by path must exist: build/<path> in the build tree, tools/<x> or bench/<x> in
  the repository (so a wrong path such as tools/troupe-launch cannot stand);
- a troupe program (by path, or by its installed name: troupe-launch, mlp_classifier, ...) must
  list every flag the command gives it in its --help;
- a command that starts with a program of the build tree and names no other host runs for real,
  for at most a few seconds (ports become 0, paths under /tmp a scratch directory of its own), a few
  side by side: it must exit 0, or still be running when stopped. A bad command line exits 2 at once.

  shell_commands_test.py REPO_DIR BUILD_DIR
"""
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor

REPO, BUILD = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
RUN_SECONDS = 6
PARALLEL_RUNS = 5  # the runs are independent, each in its own scratch directory

# Installed names (PREFIX/bin, PREFIX/libexec/troupe/examples) and where the build has them.
INSTALLED = {name: f"tools/{name}" for name in ("troupe-launch", "troupe-worker", "troupe-ckpt",
                                                "troupe-doctor")}
INSTALLED.update({name: f"examples/{name}" for name in
                  ("seed_examples", "quickstart", "custom_loop", "mlp_classifier", "multi_worker_trainer",
                   "ps_trainer", "digits_cnn")})

failures = []
checked = {"commands": 0, "programs": 0, "runs": 0}
lock = threading.Lock()


def fail(where, message):
    with lock:
        failures.append(f"{where}: {message}")


def shell_blocks(path):
    """(line number, command) of every command in the file's ```sh blocks."""
    commands = []
    in_block = False
    pending, start = "", 0
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            stripped = line.rstrip("\n")
            if stripped.startswith("```"):
                in_block = stripped.strip() == "```sh" if not in_block else False
                continue
            if not in_block:
                continue
            text = re.sub(r"(^|\s)#.*$", "", stripped).rstrip()  # a comment to the end of the line
            if not pending:
                start = number
            if text.endswith("\\"):
                pending += text[:-1] + " "
                continue
            pending += text
            try:
                shlex.split(pending)
            except ValueError:  # a quote that goes on to the next line
                pending += "\n"
                continue
            if pending.strip():
                commands.append((start, pending.strip()))
            pending = ""
    return commands


def split_words(command):
    """The words of one command, the environment assignments in front dropped; None when the
    command is not a simple one (an unclosed quote spanning lines)."""
    try:
        words = shlex.split(command)
    except ValueError:
        return None
    while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
        words.pop(0)
    return words


def troupe_program(word):
    """The build tree's file for a troupe program named by `word`, or None for another program."""
    if word.startswith("build/"):
        return os.path.join(BUILD, word[len("build/"):])
    if word in INSTALLED:
        return os.path.join(BUILD, INSTALLED[word])
    return None


help_cache = {}


def help_text(program):
    if program not in help_cache:
        out = subprocess.run([program, "--help"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60,
                             text=True)
        help_cache[program] = (out.returncode, out.stdout)
    return help_cache[program]


def check_flags(where, word, program, args):
    status, text = help_text(program)
    if status != 0:
        fail(where, f"{word} --help exits {status}")
        return
    for arg in args:
        flag = arg.strip("[]").split("=", 1)[0]
        if not flag.startswith("-") or flag in ("-", "--"):
            continue
        if flag.endswith("..."):
            flag = flag[:-3]
        if not re.search(r"(^|[\s,\[])" + re.escape(flag) + r"($|[\s,=\]])", text, re.M):
            fail(where, f"{word} does not take {flag} (not in its --help)")


def check_path(where, word):
    """False when `word` names a file of troupe that is not there."""
    if word.startswith("build/"):
        path = os.path.join(BUILD, word[len("build/"):])
        if not os.access(path, os.X_OK):
            fail(where, f"{word}: no such program in the build tree ({path})")
            return False
    elif re.match(r"^(tools|bench|examples|tests)/", word):
        if not os.path.exists(os.path.join(REPO, word)):
            hint = ""
            if os.path.exists(os.path.join(BUILD, word)):
                hint = f" (the program is build/{word})"
            fail(where, f"{word}: no such file in the repository{hint}")
            return False
    return True


def runnable(words):
    text = " ".join(words)
    return words[0].startswith("build/") and "--hosts" not in text and "[" not in text


def run_bounded(where, words, scratch):
    scratch = tempfile.mkdtemp(dir=scratch)  # its own: the runs go side by side
    args = []
    for i, w in enumerate(words):
        if i > 0 and words[i - 1] == "--dashboard-port":
            w = "0"  # any free port: the suite runs in parallel
        w = w.replace("/tmp/", scratch + "/")
        if w.startswith("build/"):
            w = os.path.join(BUILD, w[len("build/"):])
        elif "." in w and not w.startswith("-") and "/" not in w and re.match(r"^[\w.-]+\.(json|csv|ckpt)$", w):
            w = os.path.join(scratch, w)  # an output file the command names
        args.append(w)
    env = dict(os.environ)
    env.pop("TF_CONFIG", None)
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=scratch,
                            start_new_session=True, env=env)
    try:
        out, _ = proc.communicate(timeout=RUN_SECONDS)
        status = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            out, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
        status = None  # still running: the command line was taken
    with lock:
        checked["runs"] += 1
    if status not in (None, 0):
        fail(where, f"exited {status} within {RUN_SECONDS} s:\n    " + "\n    ".join(out.splitlines()[-8:]))


def main():
    files = [os.path.join(REPO, "README.md")]
    docs = os.path.join(REPO, "docs")
    files += sorted(os.path.join(docs, f) for f in os.listdir(docs) if f.endswith(".md"))
    runs = []
    with tempfile.TemporaryDirectory() as scratch:
        for path in files:
            for number, command in shell_blocks(path):
                where = f"{os.path.relpath(path, REPO)}:{number}: {command}"
                words = split_words(command)
                if not words:
                    continue
                checked["commands"] += 1
                # The program, and after "--" (troupe-launch, srun ...) the program it starts.
                groups, current = [], []
                for w in words:
                    if w == "--":
                        groups.append(current)
                        current = []
                    else:
                        current.append(w)
                groups.append(current)
                paths_ok = all(check_path(where, w) for w in words if not w.startswith("-"))
                for group in groups:
                    if not group:
                        continue
                    # "srun -N1 -w node02 troupe-worker ...": the troupe program within the group.
                    for i, w in enumerate(group):
                        program = troupe_program(w)
                        if program:
                            if os.access(program, os.X_OK):
                                checked["programs"] += 1
                                check_flags(where, w, program, group[i + 1:])
                            else:
                                fail(where, f"{w}: not built ({program})")
                            break
                if paths_ok and runnable(words) and not failures_for(where):
                    runs.append((where, words))
        with ThreadPoolExecutor(max_workers=PARALLEL_RUNS) as pool:
            for future in [pool.submit(run_bounded, where, words, scratch) for where, words in runs]:
                future.result()
    print(f"shell_commands_test: {checked['commands']} commands, {checked['programs']} troupe programs' flags "
          f"checked, {checked['runs']} run")
    if checked["commands"] == 0:
        print("shell_commands_test: FAILED: no ```sh command found", file=sys.stderr)
        return 1
    if failures:
        print("shell_commands_test: FAILED:\n  " + "\n  ".join(failures), file=sys.stderr)
        return 1
    return 0


def failures_for(where):
    return any(f.startswith(where) for f in failures)


if __name__ == "__main__":
    sys.exit(main())
