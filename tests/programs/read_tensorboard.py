"""Reads the event files mlp_classifier wrote with TensorBoard's own reader and checks the scalars
against what the trainer printed. Usage: read_tensorboard.py LOG_DIR TRAINER_STDOUT"""
import glob
import math
import re
import sys

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

log_dir, stdout_path = sys.argv[1], sys.argv[2]
failures = []


def check(ok, what):
    if not ok:
        failures.append(what)


def scalars(run):
    files = glob.glob(f"{log_dir}/{run}/events.out.tfevents.*")
    if len(files) != 1:
        sys.exit(f"FAILED: expected one event file in {log_dir}/{run}, found {files}")
    acc = EventAccumulator(files[0], size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def close(a, b, rel, abs_tol=0.0):
    return math.isclose(a, b, rel_tol=rel, abs_tol=abs_tol)


text = open(stdout_path).read()
steps_per_epoch = int(re.search(r"(\d+) steps per epoch", text).group(1))
learning_rate = float(re.search(r" lr ([0-9.e-]+);", text).group(1))
epochs = re.findall(
    r"^Epoch (\d+)/\d+: (\d+) steps, loss ([0-9.e-]+), accuracy ([0-9.]+), val_loss ([0-9.]+), val_accuracy ([0-9.]+),",
    text, re.M)
if not epochs:
    sys.exit("FAILED: the trainer printed no epoch line with validation:\n" + text)

train = scalars("train")
validation = scalars("validation")
total = steps_per_epoch * len(epochs)

# Per epoch, at the epoch (0-based), as Keras's TensorBoard callback writes them.
for i, (number, steps, loss, accuracy, val_loss, val_accuracy) in enumerate(epochs):
    check(int(number) == i + 1 and int(steps) == steps_per_epoch, f"epoch line {i}")
    check(train["epoch_loss"][i][0] == i and close(train["epoch_loss"][i][1], float(loss), 1e-5),
          f"epoch_loss {train['epoch_loss'][i]} vs printed {loss}")
    check(close(train["epoch_accuracy"][i][1], float(accuracy), 0, 6e-5),
          f"epoch_accuracy {train['epoch_accuracy'][i]} vs printed {accuracy}")
    check(validation["epoch_loss"][i][0] == i and close(validation["epoch_loss"][i][1], float(val_loss), 0, 6e-5),
          f"validation epoch_loss {validation['epoch_loss'][i]} vs printed {val_loss}")
    check(close(validation["epoch_accuracy"][i][1], float(val_accuracy), 0, 6e-5),
          f"validation epoch_accuracy {validation['epoch_accuracy'][i]} vs printed {val_accuracy}")
    check(close(train["epoch_learning_rate"][i][1], learning_rate, 1e-6), "epoch_learning_rate")

# Per step, at the global step 1..total.
loss = train["loss"]
check([s for s, _ in loss] == list(range(1, total + 1)), f"loss steps {[s for s, _ in loss]}")
for i in range(len(epochs)):
    mean = sum(v for _, v in loss[i * steps_per_epoch:(i + 1) * steps_per_epoch]) / steps_per_epoch
    check(close(mean, train["epoch_loss"][i][1], 1e-5), f"epoch {i}: mean step loss {mean} vs epoch_loss")
check(all(close(v, learning_rate, 1e-6) for _, v in train["learning_rate"]), "learning_rate per step")
replicas = sorted(t for t in train if t.startswith("loss/replica_"))
check(replicas == ["loss/replica_0", "loss/replica_1"], f"per-replica tags {replicas}")
for k in range(total):
    # Equal shares of the global batch: the global loss is the mean of the replicas' own losses.
    mean = sum(train[r][k][1] for r in replicas) / len(replicas)
    check(close(mean, loss[k][1], 1e-4), f"step {k + 1}: replicas' mean {mean} vs loss {loss[k][1]}")
for k in range(total):
    parts = sum(train[f"time/{p}_ms"][k][1] for p in ("input", "compute", "all_reduce"))
    step_ms = train["time/step_ms"][k][1]
    check(step_ms > 0 and close(parts, step_ms, 1e-4, 1e-3), f"step {k + 1}: parts {parts} ms vs step {step_ms} ms")
    check(train["samples_per_second"][k][1] > 0, "samples_per_second")
    check(0 <= train["accuracy"][k][1] <= 1, "accuracy per step")

if failures:
    print("FAILED:\n  " + "\n  ".join(failures[:20]))
    sys.exit(1)
print(f"PASSED TensorBoard read {len(train)} train tags and {len(validation)} validation tags, "
      f"{total} steps, {len(epochs)} epochs")
