"""``python -m phrasescore``."""

from phrasescore.cli import main

if __name__ == "__main__":
    main()
