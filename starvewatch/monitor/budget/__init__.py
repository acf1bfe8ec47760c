"""The storage budget (`serve --max-db-size`): retention policy, folds of raw steps and
samples, rollup tiers."""
