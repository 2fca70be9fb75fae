"""Each row's difficulty, as training sees it: observations recorded with every version, a
posterior over each row's pass rate, retirement and revival, and the frontier sampler the
trainer-side datasets draw with (see record.py, posterior.py, observe.py, frontier.py)."""
