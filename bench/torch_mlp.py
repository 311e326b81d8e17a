#!/usr/bin/env python3
"""The PyTorch twin of mlp_classifier, on a GPU for bench/gpu_training_bench.sh and on the CPU
(--device cpu --threads N) for bench/host_scaling.sh: the same MLP
(FEATURES -> HIDDEN relu -> HIDDEN relu -> CLASSES, Glorot-uniform kernels, zero biases), plain
SGD, sparse softmax cross-entropy from logits, global batch BATCH, eager mode, and cached input
(BATCHES batches made once on the GPU and repeated, as mlp_classifier --cached-batches does). The
loss is read on the host every step (loss.item()), as Model::fit reports it.

Math modes, as the bench compares them:
  --math fp32    exact float32 products (torch.backends.cuda.matmul.allow_tf32 = False)
  --math tf32    TensorFloat-32 products (allow_tf32 = True)
  --math bf16    torch.autocast(dtype=torch.bfloat16), float32 weights (Keras's mixed_bfloat16)

Prints the result line mlp_classifier prints, plus the peak device memory:
  result: replicas=1 batch=1024 input=cached steps=... samples_per_s=... loss=... peak_mib=...
samples_per_s is the median over epochs, the first (warm-up) left out.

  python3 bench/torch_mlp.py --batch 1024 --features 784 --hidden 4096 --classes 10 --math tf32
"""
import argparse
import statistics
import time

import torch


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--batches", type=int, default=16, help="cached batches per epoch")
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--features", type=int, default=784)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--math", choices=["fp32", "tf32", "bf16"], default="fp32")
    p.add_argument("--device", default="cuda:0", help="cuda:N or cpu")
    p.add_argument("--threads", type=int, default=0, help="CPU threads (torch.set_num_threads; 0: PyTorch's default)")
    a = p.parse_args()

    dev = torch.device(a.device)
    gpu = dev.type == "cuda"
    if gpu and not torch.cuda.is_available():
        raise SystemExit("torch_mlp.py: no CUDA device (torch.cuda.is_available() is False)")
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    if not gpu and a.math != "fp32":
        raise SystemExit("torch_mlp.py: --math tf32 and bf16 are GPU modes")
    torch.backends.cuda.matmul.allow_tf32 = a.math == "tf32"
    torch.backends.cudnn.allow_tf32 = a.math == "tf32"
    torch.manual_seed(1)

    model = torch.nn.Sequential(
        torch.nn.Linear(a.features, a.hidden), torch.nn.ReLU(),
        torch.nn.Linear(a.hidden, a.hidden), torch.nn.ReLU(),
        torch.nn.Linear(a.hidden, a.classes)).to(dev)
    for m in model:
        if isinstance(m, torch.nn.Linear):
            torch.nn.init.xavier_uniform_(m.weight)
            torch.nn.init.zeros_(m.bias)
    opt = torch.optim.SGD(model.parameters(), lr=a.lr)
    loss_fn = torch.nn.CrossEntropyLoss()

    g = torch.Generator(device=dev).manual_seed(2)
    xs = [torch.randn(a.batch, a.features, device=dev, generator=g) for _ in range(a.batches)]
    ys = [torch.randint(0, a.classes, (a.batch,), device=dev, generator=g) for _ in range(a.batches)]

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        if a.math == "bf16":
            with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
                loss = loss_fn(model(x), y)
        else:
            loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss.item()

    if gpu:
        torch.cuda.reset_peak_memory_stats(dev)
    rates = []
    loss = float("nan")
    steps = 0
    for epoch in range(a.epochs):
        if gpu:
            torch.cuda.synchronize(dev)
        start = time.perf_counter()
        for x, y in zip(xs, ys):
            loss = step(x, y)
            steps += 1
        if gpu:
            torch.cuda.synchronize(dev)
        elapsed = time.perf_counter() - start
        if epoch > 0:
            rates.append(a.batch * a.batches / elapsed)
    peak = torch.cuda.max_memory_allocated(dev) / (1 << 20) if gpu else 0.0
    print(f"result: replicas=1 batch={a.batch} input=cached steps={steps} "
          f"samples_per_s={statistics.median(rates):.1f} loss={loss:.4f} peak_mib={peak:.1f}", flush=True)


if __name__ == "__main__":
    main()
