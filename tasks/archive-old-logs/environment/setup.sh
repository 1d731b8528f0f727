#!/bin/bash
set -e
mkdir -p /app/logs
cd /app/logs
mk() { python3 -c "import sys;n,s=sys.argv[1],int(sys.argv[2]);print(''.join(f'{n} line {i} seed {s*i%997}\n' for i in range(40+s)),end='')" "$1" "$2" > "$1"; touch -d "$3" "$1"; }
mk api-2024-01.log 1 "2024-01-31 23:00:00 UTC"
mk api-2024-03.log 2 "2024-03-15 10:00:00 UTC"
mk worker-2024-05.log 3 "2024-05-31 23:59:58 UTC"
mk worker-2024-06.log 4 "2024-06-01 00:00:01 UTC"
mk api-2024-07.log 5 "2024-07-02 08:00:00 UTC"
mk "db slow 2024-02.log" 6 "2024-02-02 02:02:02 UTC"
mk current.log 7 "2024-09-01 12:00:00 UTC"
mk notes-2023.txt 8 "2023-01-01 00:00:00 UTC"
mk old-config.log.bak 9 "2023-05-05 00:00:00 UTC"
