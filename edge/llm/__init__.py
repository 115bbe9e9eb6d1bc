"""The language-model client of speculative decoding, numpy only: the acceptance rules, the
on-device draft, and the device's half of client–server decoding."""
