"""What a trained model does, looked at: ``info``, ``translate``, ``evaluate``, ``sample``,
``represent``, ``compare`` and ``align``, one module each."""
