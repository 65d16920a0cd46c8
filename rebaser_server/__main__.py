from rebaser_server.cli import main

main()
