"""The PolyMix-3 content mix (Table 5.2 of the 2002 Squid paper): image 65%
exp(4.5 KB), HTML 15% exp(8.5 KB), download 0.5% lognormal(300 KB, 300 KB),
other 19.5% lognormal(25 KB, 10 KB). One sampler for every bench that needs
object sizes (the C harness has its own copy in objbench/workload.c)."""

import math
import random


def _lognormal(rng: random.Random, mean: float, sd: float) -> float:
    s2 = math.log(1 + sd * sd / (mean * mean))
    return rng.lognormvariate(math.log(mean) - s2 / 2, math.sqrt(s2))


def size_kb(rng: random.Random) -> float:
    pick = rng.random()
    if pick < 0.65:
        return rng.expovariate(1 / 4.5)
    if pick < 0.80:
        return rng.expovariate(1 / 8.5)
    if pick < 0.805:
        return _lognormal(rng, 300, 300)
    return _lognormal(rng, 25, 10)
