"""Checkpoints: crash-safe saving, discovery of the newest verified one, exact resume, conversion.

``manager.CheckpointManager`` is the face the trainer uses (save / resolve / load / prune);
``verify`` checks a folder; ``convert`` and ``reader`` turn a DeepSpeed checkpoint into Hugging Face or
safetensors files tensor by tensor; ``reshard`` changes the world size through universal checkpoints;
``signals.StopRequested`` turns SIGTERM/SIGINT into "finish the step, save, exit 0". ``layout`` names
the files. Nothing here imports torch or DeepSpeed at module level except where it is the job.
"""
