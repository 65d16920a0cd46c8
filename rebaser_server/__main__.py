from rebaser_server.cli.main import main

main()
