#!/usr/bin/env python3
"""A token command for the lab (the worker's ``provider = "command"``, like msmtp's passwordeval).

    lab_token_command.py TOKEN_URL CLIENT_ID [--bare]

Asks the lab's token server for a client-credentials token and prints the
token response (JSON with access_token and expires_in), or with ``--bare``
the token alone.  The client secret comes from $LAB_CLIENT_SECRET, never
from the command line.  Exit status 3 and a line on stderr when refused.
"""

import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request


def main() -> int:
    url, client_id = sys.argv[1], sys.argv[2]
    body = urllib.parse.urlencode({"grant_type": "client_credentials", "client_id": client_id,
                                   "client_secret": os.environ.get("LAB_CLIENT_SECRET", "")}).encode()
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=body), timeout=10) as resp:
            data = json.load(resp)
    except urllib.error.HTTPError as exc:
        print(f"token request refused: {exc.code} {json.load(exc).get('error')}", file=sys.stderr)
        return 3
    print(data["access_token"] if "--bare" in sys.argv else json.dumps(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
