"""`draftdata demo`: the whole pipeline on embedded defaults (samples, a simulated fleet)."""
