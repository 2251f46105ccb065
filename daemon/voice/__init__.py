"""Voice notes and audio files transcribed before their turn (README, "Voice notes")."""
