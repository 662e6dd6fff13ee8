"""The project's tiny models, built offline: tiny T5 and causal LMs for the tests, and the demo's causal LM
pre-trained on a synthetic language corpus, whose shipped weights (tiny/weights) the builds check (tiny/build.py);
and the measurements of that prior's policy (tiny/prior.py). Above the agent, which they train and measure."""
