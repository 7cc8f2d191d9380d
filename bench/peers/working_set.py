"""The bytes of K/V copies a peer harness rotates through, as pagedattn's
benchmarks size theirs (perf/workload_rules.h): at least max(256 MiB, 4 x L3),
so that decode reads K/V from DRAM, not from the last-level cache."""
import glob


def l3_cache_bytes(fallback=32 << 20):
    """The L3 size this (virtual) machine exposes in sysfs, or `fallback`."""
    for index in sorted(glob.glob("/sys/devices/system/cpu/cpu0/cache/index*")):
        try:
            with open(f"{index}/level") as f:
                if int(f.read()) != 3:
                    continue
            with open(f"{index}/size") as f:
                size = f.read().strip()
        except (OSError, ValueError):
            continue
        unit = {"K": 1 << 10, "M": 1 << 20}.get(size[-1:], 1)
        digits = size[:-1] if unit != 1 else size
        if digits.isdigit():
            return int(digits) * unit
    return fallback


def working_set_bytes():
    return max(256 << 20, 4 * l3_cache_bytes())
