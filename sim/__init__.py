"""The simulator: Megha and the baseline schedulers (centralized, PigeonC, Sparrow) behind one system interface,
on the in-memory transport's virtual clock, and the experiments that compare them."""
