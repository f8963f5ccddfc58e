"""`readout steer`: the gap study's first-token readouts (D, J0, control and their twins) read with a direction
added to the residual stream after a layer (engine/steering.py), on a held-out half of the scenarios, for a grid of
layers and strengths, beside a random-direction null and the unsteered read. The directions come from the panel's
own contrasts on the other half (the training split); a user's vector file also works.

    split       the seeded, disjoint training / held-out split of the profile's selection
    directions  pressure and judgment directions per depth from the training split; random nulls; vector files
    study       the run driver's study (manifest, chunks, resume, shards) and its chunk runner
    plan        its workload for `--plan`; summary: the lines a finished grid prints
The `readout steer` command is cli/steer.py.
"""
