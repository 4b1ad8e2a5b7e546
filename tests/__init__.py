"""dcnb's tests, and the catalogs of models and ops (zoo, hf_models, ops, models) the benchmarks import too."""
