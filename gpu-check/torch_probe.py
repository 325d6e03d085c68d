"""gpu-check's PyTorch probe: the CUDA hook under a real framework (the runtime API reaches the
driver through cuGetProcAddress, the caching allocator rounds and retries on OOM).
Usage: torch_probe.py meminfo | alloc <MiB> [hold_s] | matmul <seconds>
Prints key=value lines that run.sh reads."""
import sys
import time

import torch


def main() -> None:
    mode = sys.argv[1] if len(sys.argv) > 1 else ""
    torch.cuda.init()
    if mode == "meminfo":
        free, total = torch.cuda.mem_get_info()
        print(f"free={free} total={total}", flush=True)
    elif mode == "alloc":
        mib = int(sys.argv[2])
        hold = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0
        try:
            x = torch.ones(mib << 20, dtype=torch.uint8, device="cuda")
            torch.cuda.synchronize()
            print(f"alloc=ok sum={int(x[:4096].sum())}", flush=True)
            time.sleep(hold)
        except torch.cuda.OutOfMemoryError:
            print("alloc=oom", flush=True)
        except RuntimeError as e:  # any other refusal: say which
            print("alloc=error " + str(e).splitlines()[0].replace(" ", "_"), flush=True)
    elif mode == "matmul":
        seconds = float(sys.argv[2])
        a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
        for _ in range(10):
            a @ b
        torch.cuda.synchronize()
        # The first seconds let the limiter settle; the rate is read over the rest.
        settle = min(2.0, seconds / 3)
        start = time.time()
        n = 0
        counted_from, counted = None, 0
        while time.time() - start < seconds:
            a @ b
            n += 1
            if n % 8 == 0:
                torch.cuda.synchronize()
                now = time.time()
                if counted_from is None and now - start >= settle:
                    counted_from, counted = now, n
        torch.cuda.synchronize()
        end = time.time()
        rate = (n - counted) / (end - counted_from) if counted_from else n / (end - start)
        print(f"matmuls_per_s={rate:.1f}", flush=True)
    else:
        print("error=usage: torch_probe.py meminfo | alloc <MiB> [hold_s] | matmul <seconds>")
        sys.exit(2)


if __name__ == "__main__":
    main()
