"""`python -m appliance` and the frozen one-file binary both start here."""

from appliance.cli import main

if __name__ == "__main__":
    main()
