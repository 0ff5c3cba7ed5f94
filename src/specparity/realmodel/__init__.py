"""The real-model tier: a pretrained target nobody here wrote (SmolLM2-135M-Instruct) and a drafter trained on it.

``fetch`` brings the target into a cache outside git (``python -m specparity.realmodel fetch``);
``demo`` is ``make demo-real``. docs/real-model.md has the training run and the figures.
"""
