/*
mailq.RenderDbMailQuery: internal to mailq.SendDbMail (no role may call it;
SendDbMail reaches it through ownership chaining).  Runs @Query in @Database
in the CALLER's security context and renders its result as text (Database
Mail's format), an HTML table or CSV.

Security:    the query runs through sys.sp_executesql in dynamic SQL.  Dynamic
             SQL is a new batch: ownership chaining does not carry into it, so
             every object the query names is checked against the caller's own
             permissions (this procedure has no EXECUTE AS clause, so the
             caller is who runs it; see "Ownership chains" and "EXECUTE AS
             clause" in Microsoft's reference,
             https://learn.microsoft.com/en-us/sql/relational-databases/security/ownership-chains
             and https://learn.microsoft.com/en-us/sql/t-sql/statements/execute-as-clause-transact-sql).
             The database is entered with QUOTENAME(@Database).sys.sp_executesql,
             which runs the batch in that database as the caller's user there;
             cross-database ownership chaining stays as the server has it
             (off by default), and this package never marks a database as trusted, so
             nothing is run with more rights than the caller has.
How:         1. sys.dm_exec_describe_first_result_set (run in @Database) gives
                the first result set's columns and types;
             2. #DbMailResult gets one typed column per result column (c1..cn,
                ALTER TABLE in dynamic SQL: a temp table created inside dynamic
                SQL would vanish with that batch);
             3. INSERT INTO #DbMailResult (c1..cn) EXEC <db>.sys.sp_executesql @Query;
             4. one dynamic SELECT renders the rows with STRING_AGG.
Supported:   one result set (INSERT ... EXEC appends every result set of the
             query to the table: further result sets of the same shape are
             appended, others fail as a query error).  Not supported: a query
             whose first result set cannot be described (temp tables made by
             the query, shape decided at run time: the describe error is the
             query's error, 50195 or appended), a query that
             itself runs INSERT ... EXEC, or a SendDbMail called inside
             INSERT ... EXEC (SQL Server refuses nested INSERT ... EXEC,
             error 8164), CLR user-defined types of the query's database.
Text format: the sqlcmd layout Database Mail uses: a header line (column
             names) and a line of '-' unless @Header = 0, then one line per
             row, columns separated by @Separator, each padded with spaces
             to its width (numbers right-aligned), a blank line and
             '(n rows affected)'.  Width of a column: the longer of its name
             and its type's display width (int 11, bigint 20, smallint 6,
             tinyint 3, bit 1, decimal(p,s) p+2, float 24, real 14, money 21,
             smallmoney 12, date 10, time 16, datetime 23, smalldatetime 19,
             datetime2 27, datetimeoffset 34, uniqueidentifier 36, (n)char
             and (n)varchar(n) n, binary(n) 2n+2), at least 4 ('NULL') for a
             nullable column; (max), xml, text and other large types 256.
             Values longer than the width are cut (@NoTruncate = 0); with
             @NoTruncate = 1 large values are whole and their column as wide
             as the longest value.  Lines longer than @Width are wrapped every
             @Width characters.  @NoPadding = 1: no padding, no wrapping.
             Values: NULL as NULL, dates in ODBC canonical style (121),
             binary as 0x hex, money with 4 decimals, float and real as
             CONVERT's default (6 significant digits; sqlcmd shows more).
             At most 127 columns (CONCAT takes 254 arguments).
Extension:   @Format 'HTML' (a <table> with <th> header cells, values
             HTML-escaped) or 'CSV' (RFC 4180: comma, CRLF, fields quoted when
             they hold a comma, quote, CR or LF; NULL as an empty field).
Parameters:  @Query NVARCHAR(MAX), @Database SYSNAME (an existing database,
             checked by SendDbMail), @Header BIT, @Width INT 10-32767,
             @Separator NCHAR(1), @NoTruncate BIT, @NoPadding BIT,
             @Format VARCHAR(4) TEXT | HTML | CSV
Outputs:     @Result NVARCHAR(MAX): the rendering (N'' when the query returns
             no result set), @QueryError NVARCHAR(4000): NULL, or the query's
             error as sqlcmd prints it ('Msg n, Level n, State n, ...' and
             the message) when the query failed.
Errors:      50196 a column type cannot be held in a temp table, or a padded
             line needs more than 10,000 pieces of @Width characters.  A query error is returned in @QueryError, not
             raised, unless it doomed the caller's transaction (XACT_STATE()
             = -1): then it is re-raised, and the caller's transaction must be
             rolled back.
Transaction: none of its own; writes only its temp table.  XACT_ABORT is
             OFF while the query runs, so that a statement-level error of the
             query does not doom a caller's transaction.
Isolation:   the caller's: the query runs in the caller's own session at the
             caller's level (Database Mail runs it in a separate session:
             docs/database-mail.md lists the difference).
Lock order:  none of its own beyond tempdb's #DbMailResult; the caller's query
             takes what it takes.
*/
CREATE OR ALTER PROCEDURE mailq.RenderDbMailQuery
    @Query NVARCHAR(MAX),
    @Database SYSNAME,
    @Header BIT,
    @Width INT,
    @Separator NCHAR(1),
    @NoTruncate BIT,
    @NoPadding BIT,
    @Format VARCHAR(4),
    @Result NVARCHAR(MAX) OUTPUT,
    @QueryError NVARCHAR(4000) OUTPUT
AS
BEGIN
    SET NOCOUNT, XACT_ABORT ON;

    DECLARE @Msg NVARCHAR(2048);
    DECLARE @CrLf NCHAR(2) = NCHAR(13) + NCHAR(10);
    DECLARE @Sql NVARCHAR(MAX);
    -- <database>.sys.sp_executesql runs its batch in that database.
    DECLARE @Exec NVARCHAR(300) = QUOTENAME(@Database) + N'.sys.sp_executesql';
    SET @Result = N'';
    SET @QueryError = NULL;

    DECLARE @Described TABLE (
        ColumnOrdinal INT NULL,
        ColumnName SYSNAME NULL,
        IsNullable BIT NULL,
        SystemTypeName NVARCHAR(256) NULL,
        MaxLength SMALLINT NULL,
        TypePrecision TINYINT NULL,
        ErrorNumber INT NULL,
        ErrorMessage NVARCHAR(4000) NULL
    );
    DECLARE @Column TABLE (
        ColumnNo INT NOT NULL PRIMARY KEY,
        HeaderText NVARCHAR(128) NOT NULL,
        TempType NVARCHAR(256) NOT NULL,
        Category VARCHAR(8) NOT NULL,
        DisplayWidth INT NOT NULL,
        IsNullable BIT NOT NULL
    );

    -- XACT_ABORT OFF from here on: an error of the query (or of describing
    -- it) ends that statement and lands in CATCH without dooming a transaction
    -- the caller holds.  Errors SQL Server always makes batch-aborting still
    -- doom it; then nothing can be written any more and the error is
    -- re-raised.  The setting reverts when the procedure returns.
    SET XACT_ABORT OFF;

    -- 1. Describe the first result set, in @Database, as the caller.
    BEGIN TRY
        INSERT INTO @Described (
            ColumnOrdinal, ColumnName, IsNullable, SystemTypeName, MaxLength, TypePrecision,
            ErrorNumber, ErrorMessage
        )
        EXEC @Exec
            N'SELECT d.column_ordinal, d.name, d.is_nullable, d.system_type_name, d.max_length,
                d.precision, d.error_number, d.error_message
            FROM sys.dm_exec_describe_first_result_set(@tsql, NULL, 0) AS d
            WHERE d.is_hidden = 0 OR d.is_hidden IS NULL;',
            N'@tsql NVARCHAR(MAX)',
            @tsql = @Query;
    END TRY
    BEGIN CATCH
        IF XACT_STATE() = -1 THROW;
        SET @QueryError = CONCAT(
            N'Msg ', ERROR_NUMBER(), N', Level ', ERROR_SEVERITY(), N', State ', ERROR_STATE(),
            N', Server ', @@SERVERNAME, N', Line ', ERROR_LINE(), @CrLf, ERROR_MESSAGE()
        );
        RETURN 0;
    END CATCH;

    -- An error found while describing is the query's error (an unknown table,
    -- a column the caller may not read...): level and state are not reported
    -- by the describe function; 16 and 1 are shown.
    SELECT TOP (1) @QueryError = CONCAT(
        N'Msg ', d.ErrorNumber, N', Level 16, State 1, Server ', @@SERVERNAME, N', Line 1', @CrLf,
        d.ErrorMessage
    )
    FROM @Described AS d
    WHERE d.ErrorNumber IS NOT NULL;
    IF @QueryError IS NOT NULL RETURN 0;

    -- 2. The column list: a temp-table type for every column (character data
    --    as Unicode, so no code page of the source database loses text) and
    --    the display width of the text format.
    WITH Typed AS (
        SELECT
            d.ColumnOrdinal,
            d.ColumnName,
            d.IsNullable,
            d.MaxLength,
            d.TypePrecision,
            LOWER(d.SystemTypeName) AS FullName,
            LOWER(LEFT(d.SystemTypeName, CHARINDEX(N'(', d.SystemTypeName + N'(') - 1)) AS BaseName
        FROM @Described AS d
    )

    INSERT INTO @Column (ColumnNo, HeaderText, TempType, Category, DisplayWidth, IsNullable)
    SELECT
        ROW_NUMBER() OVER (ORDER BY n.ColumnOrdinal) AS ColumnNo,
        COALESCE(n.ColumnName, N'') AS HeaderText,
        CASE
            WHEN n.BaseName IN (N'varchar', N'nvarchar') AND n.MaxLength = -1 THEN N'nvarchar(max)'
            WHEN n.BaseName IN (N'text', N'ntext') THEN N'nvarchar(max)'
            -- xml stays xml: SQL Server converts xml to text only explicitly.
            WHEN n.BaseName = N'xml' THEN N'xml'
            WHEN n.BaseName = N'image' THEN N'varbinary(max)'
            WHEN n.BaseName = N'timestamp' THEN N'binary(8)'
            WHEN n.BaseName IN (N'varchar', N'char') AND n.MaxLength > 4000 THEN N'nvarchar(max)'
            WHEN n.BaseName IN (N'varchar', N'char') THEN N'n' + n.FullName
            ELSE n.FullName
        END AS TempType,
        CASE
            WHEN n.BaseName IN (N'money', N'smallmoney') THEN 'money'
            WHEN
                n.BaseName IN (
                    N'int', N'bigint', N'smallint', N'tinyint', N'decimal', N'numeric',
                    N'float', N'real', N'money', N'smallmoney'
                )
                THEN 'number'
            WHEN
                n.BaseName IN (N'date', N'time', N'datetime', N'datetime2', N'smalldatetime', N'datetimeoffset')
                THEN 'time'
            WHEN n.BaseName IN (N'binary', N'varbinary', N'image', N'timestamp') THEN 'binary'
            WHEN n.BaseName IN (N'geometry', N'geography') THEN 'spatial'
            ELSE 'text'
        END AS Category,
        CASE
            WHEN n.BaseName = N'int' THEN 11
            WHEN n.BaseName = N'bigint' THEN 20
            WHEN n.BaseName = N'smallint' THEN 6
            WHEN n.BaseName = N'tinyint' THEN 3
            WHEN n.BaseName = N'bit' THEN 1
            WHEN n.BaseName IN (N'decimal', N'numeric') THEN n.TypePrecision + 2
            WHEN n.BaseName = N'float' THEN 24
            WHEN n.BaseName = N'real' THEN 14
            WHEN n.BaseName = N'money' THEN 21
            WHEN n.BaseName = N'smallmoney' THEN 12
            WHEN n.BaseName = N'date' THEN 10
            WHEN n.BaseName = N'time' THEN 16
            WHEN n.BaseName = N'datetime' THEN 23
            WHEN n.BaseName = N'smalldatetime' THEN 19
            WHEN n.BaseName = N'datetime2' THEN 27
            WHEN n.BaseName = N'datetimeoffset' THEN 34
            WHEN n.BaseName = N'uniqueidentifier' THEN 36
            WHEN n.MaxLength = -1 OR n.BaseName IN (N'text', N'ntext', N'image', N'xml') THEN 256
            WHEN n.BaseName IN (N'nchar', N'nvarchar') THEN n.MaxLength / 2
            WHEN n.BaseName IN (N'char', N'varchar') THEN n.MaxLength
            WHEN n.BaseName IN (N'binary', N'varbinary', N'timestamp') THEN 2 * n.MaxLength + 2
            ELSE 256
        END AS DisplayWidth,
        COALESCE(n.IsNullable, 1) AS IsNullable
    FROM Typed AS n;

    -- Types come from the engine, but they are pasted into dynamic SQL:
    -- accept only type-name characters.
    SELECT TOP (1) @Msg = CONCAT(N'@query: column type ''', c.TempType, N''' is not supported.')
    FROM @Column AS c
    WHERE c.TempType COLLATE Latin1_General_100_BIN2 LIKE N'%[^a-z0-9(), ]%'
    ORDER BY c.ColumnNo;
    IF @Msg IS NOT NULL THROW 50196, @Msg, 1;

    CREATE TABLE #DbMailResult (mailq_row_no INT IDENTITY (1, 1) NOT NULL PRIMARY KEY);

    DECLARE @ColumnList NVARCHAR(MAX) = (
        SELECT STRING_AGG(CONVERT(NVARCHAR(MAX), CONCAT(N'c', c.ColumnNo)), N', ') WITHIN GROUP (ORDER BY c.ColumnNo)
        FROM @Column AS c
    );

    IF @ColumnList IS NOT NULL
    BEGIN
        SET @Sql = (
            SELECT
                N'ALTER TABLE #DbMailResult ADD '
                + STRING_AGG(CONVERT(NVARCHAR(MAX), CONCAT(N'c', c.ColumnNo, N' ', c.TempType, N' NULL')), N', ')
                WITHIN GROUP (ORDER BY c.ColumnNo)
                + N';'
            FROM @Column AS c
        );
        -- XACT_ABORT is OFF here: without TRY a type tempdb does not know
        -- (a CLR type of the query's database) would only end this statement,
        -- and the query would then fail on the missing column instead.
        BEGIN TRY
            EXEC sys.sp_executesql @Sql;
        END TRY
        BEGIN CATCH
            IF XACT_STATE() = -1 THROW;
            SET @Msg = CONCAT(
                N'@query: a result column''s type cannot be held in a temp table (Msg ', ERROR_NUMBER(), N': ',
                LEFT(ERROR_MESSAGE(), 1800), N').'
            );
            THROW 50196, @Msg, 1;
        END CATCH;
        SET @Sql = CONCAT(N'INSERT INTO #DbMailResult (', @ColumnList, N') EXEC ', @Exec, N' @q;');
    END;
    ELSE
        -- No result set (e.g. only an UPDATE): run it for its effect and messages.
        SET @Sql = CONCAT(N'EXEC ', @Exec, N' @q;');

    -- 3. Run the query (XACT_ABORT is OFF, see above).  Rows get their
    --    mailq_row_no in the order the query returns them, which keeps its
    --    ORDER BY in the rendering.
    BEGIN TRY
        EXEC sys.sp_executesql @Sql, N'@q NVARCHAR(MAX)', @q = @Query;
    END TRY
    BEGIN CATCH
        IF XACT_STATE() = -1 THROW;
        SET @QueryError = CONCAT(
            N'Msg ', ERROR_NUMBER(), N', Level ', ERROR_SEVERITY(), N', State ', ERROR_STATE(),
            N', Server ', @@SERVERNAME, N', Line ', ERROR_LINE(), @CrLf, ERROR_MESSAGE()
        );
    END CATCH;
    SET XACT_ABORT ON;

    IF @QueryError IS NOT NULL OR @ColumnList IS NULL RETURN 0;

    -- 4. Render.  Widths of the text format, then one expression per column.
    IF @NoTruncate = 1
    BEGIN
        -- Large values are not cut: such a column is as wide as its longest value.
        SET @Sql = (
            SELECT
                N'SELECT @w = (SELECT '
                + STRING_AGG(
                    CONVERT(
                        NVARCHAR(MAX), CONCAT(N'MAX(LEN(CONVERT(NVARCHAR(MAX), c', c.ColumnNo, N'))) AS c', c.ColumnNo)
                    ),
                    N', '
                ) WITHIN GROUP (ORDER BY c.ColumnNo)
                + N' FROM #DbMailResult FOR JSON PATH, WITHOUT_ARRAY_WRAPPER);'
            FROM @Column AS c
            WHERE c.DisplayWidth = 256
        );
        DECLARE @Longest NVARCHAR(MAX);
        IF @Sql IS NOT NULL
            EXEC sys.sp_executesql @Sql, N'@w NVARCHAR(MAX) OUTPUT', @w = @Longest OUTPUT;
        UPDATE c
        SET c.DisplayWidth = COALESCE(CAST(j.[value] AS INT), 0)
        FROM @Column AS c
        LEFT JOIN OPENJSON(@Longest) AS j ON j.[key] = CONCAT(N'c', c.ColumnNo)
        WHERE c.DisplayWidth = 256;
    END;

    UPDATE c
    SET c.DisplayWidth = (
        SELECT MAX(w.Width)
        FROM (
            VALUES
            (c.DisplayWidth),
            (IIF(@Header = 1, LEN(c.HeaderText), 0)),
            (IIF(c.IsNullable = 1, 4, 0))
        ) AS w(Width)
    )
    FROM @Column AS c;

    -- The value of column n as text (NULL as NULL); Unicode throughout.
    DECLARE @Value TABLE (ColumnNo INT NOT NULL PRIMARY KEY, Expr NVARCHAR(MAX) NOT NULL);
    INSERT INTO @Value (ColumnNo, Expr)
    SELECT
        c.ColumnNo,
        CASE c.Category
            WHEN 'time' THEN CONCAT(N'CONVERT(NVARCHAR(MAX), c', c.ColumnNo, N', 121)')
            WHEN 'binary' THEN CONCAT(N'CONVERT(NVARCHAR(MAX), c', c.ColumnNo, N', 1)')
            WHEN 'money' THEN CONCAT(N'CONVERT(NVARCHAR(MAX), c', c.ColumnNo, N', 2)')
            WHEN 'spatial' THEN CONCAT(N'CONVERT(NVARCHAR(MAX), c', c.ColumnNo, N'.STAsText())')
            ELSE CONCAT(N'CONVERT(NVARCHAR(MAX), c', c.ColumnNo, N')')
        END AS Expr
    FROM @Column AS c;

    DECLARE @RowExpr NVARCHAR(MAX), @HeaderLine NVARCHAR(MAX), @DashLine NVARCHAR(MAX);

    IF @Format = 'TEXT'
    BEGIN
        SELECT
            @RowExpr = STRING_AGG(
                CONVERT(NVARCHAR(MAX), CASE
                    WHEN @NoPadding = 1 THEN CONCAT(N'COALESCE(', v.Expr, N', N''NULL'')')
                    WHEN c.Category IN ('number', 'money') THEN CONCAT(
                        N'RIGHT(CONCAT(REPLICATE(CONVERT(NVARCHAR(MAX), N'' ''), ', c.DisplayWidth,
                        N'), COALESCE(', v.Expr, N', N''NULL'')), ', c.DisplayWidth, N')'
                    )
                    ELSE CONCAT(
                        N'LEFT(CONCAT(COALESCE(', v.Expr, N', N''NULL''), REPLICATE(CONVERT(NVARCHAR(MAX), N'' ''), ',
                        c.DisplayWidth, N')), ', c.DisplayWidth, N')'
                    )
                END),
                N', @sep, '
            ) WITHIN GROUP (ORDER BY c.ColumnNo),
            @HeaderLine = STRING_AGG(
                CONVERT(NVARCHAR(MAX), IIF(
                    @NoPadding = 1,
                    c.HeaderText,
                    LEFT(CONCAT(c.HeaderText, REPLICATE(CONVERT(NVARCHAR(MAX), N' '), c.DisplayWidth)), c.DisplayWidth)
                )),
                @Separator
            ) WITHIN GROUP (ORDER BY c.ColumnNo),
            @DashLine = STRING_AGG(
                CONVERT(NVARCHAR(MAX), REPLICATE(
                    CONVERT(NVARCHAR(MAX), N'-'), IIF(@NoPadding = 1, LEN(c.HeaderText), c.DisplayWidth)
                )),
                @Separator
            ) WITHIN GROUP (ORDER BY c.ColumnNo)
        FROM @Column AS c
        INNER JOIN @Value AS v ON c.ColumnNo = v.ColumnNo;

        -- Lines in order: header (0, 1), dashes (0, 2), rows (1, n); each cut
        -- into @Width-character pieces unless @NoPadding = 1.  Every padded
        -- line is as long as the widths and separators together, so the
        -- number of pieces per line is known here (at most 10,000).
        DECLARE @Pieces INT = (
            SELECT IIF(@NoPadding = 1, 1, CEILING((SUM(c.DisplayWidth) + COUNT(*) - 1) * 1.0 / @Width))
            FROM @Column AS c
        );
        IF @Pieces > 10000
        BEGIN
            SET @Msg = CONCAT(
                N'@query: a result line of ', @Pieces, N' x @query_result_width characters is too long to wrap; ',
                N'raise @query_result_width or set @query_result_no_padding = 1.'
            );
            THROW 50196, @Msg, 1;
        END;
        SET @Sql = CONCAT(
            N'WITH Line AS (
                SELECT 0 AS Part, 1 AS LineOrder, @header AS LineText WHERE @showHeader = 1
                UNION ALL
                SELECT 0, 2, @dashes WHERE @showHeader = 1
                UNION ALL
                SELECT 1, r.mailq_row_no, CONCAT(', @RowExpr, N', N'''') FROM #DbMailResult AS r
            ),
            Ten AS (SELECT d.n FROM (VALUES (0), (1), (2), (3), (4), (5), (6), (7), (8), (9)) AS d (n)),
            Piece AS (SELECT a.n + 10 * b.n + 100 * c.n + 1000 * e.n AS PieceNo
                FROM Ten AS a CROSS JOIN Ten AS b CROSS JOIN Ten AS c CROSS JOIN Ten AS e
                WHERE a.n + 10 * b.n + 100 * c.n + 1000 * e.n < @pieces)
            SELECT @out = STRING_AGG(
                    CONVERT(NVARCHAR(MAX), IIF(@noPadding = 1, l.LineText,
                        SUBSTRING(l.LineText, p.PieceNo * @width + 1, @width))), @crlf)
                WITHIN GROUP (ORDER BY l.Part, l.LineOrder, p.PieceNo),
                @rows = SUM(l.Part * IIF(p.PieceNo = 0, 1, 0))
            FROM Line AS l
            INNER JOIN Piece AS p
                ON p.PieceNo = 0 OR (@noPadding = 0 AND p.PieceNo * @width < DATALENGTH(l.LineText) / 2);'
        );
        DECLARE @RowCount INT;
        EXEC sys.sp_executesql
            @Sql,
            N'@sep NCHAR(1), @header NVARCHAR(MAX), @dashes NVARCHAR(MAX), @showHeader BIT, @noPadding BIT,
              @width INT, @pieces INT, @crlf NCHAR(2), @out NVARCHAR(MAX) OUTPUT, @rows INT OUTPUT',
            @sep = @Separator, @header = @HeaderLine, @dashes = @DashLine, @showHeader = @Header,
            @noPadding = @NoPadding, @width = @Width, @pieces = @Pieces, @crlf = @CrLf, @out = @Result OUTPUT,
            @rows = @RowCount OUTPUT;
        SET @Result = CONCAT(
            @Result, IIF(@Result IS NULL, N'', @CrLf), @CrLf,
            N'(', COALESCE(@RowCount, 0), IIF(@RowCount = 1, N' row affected)', N' rows affected)')
        );
    END;
    ELSE IF @Format = 'HTML'
    BEGIN
        SELECT
            @RowExpr = STRING_AGG(
                CONVERT(NVARCHAR(MAX), CONCAT(
                    N'N''<td>'', REPLACE(REPLACE(REPLACE(REPLACE(COALESCE(', v.Expr, N', N''NULL''), ',
                    N'N''&'', N''&amp;''), N''<'', N''&lt;''), N''>'', N''&gt;''), N''"'', N''&quot;''), N''</td>'''
                )),
                N', '
            ) WITHIN GROUP (ORDER BY c.ColumnNo),
            @HeaderLine = STRING_AGG(
                CONVERT(NVARCHAR(MAX), CONCAT(
                    N'<th>',
                    REPLACE(REPLACE(REPLACE(REPLACE(c.HeaderText, N'&', N'&amp;'), N'<', N'&lt;'), N'>', N'&gt;'),
                        N'"', N'&quot;'),
                    N'</th>'
                )),
                N''
            ) WITHIN GROUP (ORDER BY c.ColumnNo)
        FROM @Column AS c
        INNER JOIN @Value AS v ON c.ColumnNo = v.ColumnNo;

        SET @Sql = CONCAT(
            N'SELECT @out = STRING_AGG(CONVERT(NVARCHAR(MAX), CONCAT(N''<tr>'', ', @RowExpr, N', N''</tr>'')), @crlf)
                WITHIN GROUP (ORDER BY r.mailq_row_no)
            FROM #DbMailResult AS r;'
        );
        EXEC sys.sp_executesql @Sql, N'@crlf NCHAR(2), @out NVARCHAR(MAX) OUTPUT', @crlf = @CrLf, @out = @Result OUTPUT;
        SET @Result = CONCAT(
            N'<table border="1">', @CrLf,
            IIF(@Header = 1, CONCAT(N'<tr>', @HeaderLine, N'</tr>', @CrLf), N''),
            @Result, IIF(@Result IS NULL, N'', @CrLf),
            N'</table>'
        );
    END;
    ELSE
    BEGIN
        -- CSV (RFC 4180): quote a field that holds a comma, a quote, CR or LF.
        SELECT
            @RowExpr = STRING_AGG(
                CONVERT(NVARCHAR(MAX), CONCAT(
                    N'IIF(', v.Expr, N' COLLATE Latin1_General_100_BIN2',
                    N' LIKE N''%[,"'' + NCHAR(13) + NCHAR(10) + N'']%'', ',
                    N'N''"'' + REPLACE(', v.Expr, N', N''"'', N''""'') + N''"'', COALESCE(', v.Expr, N', N''''))'
                )),
                N', N'','', '
            ) WITHIN GROUP (ORDER BY c.ColumnNo),
            @HeaderLine = STRING_AGG(
                CONVERT(NVARCHAR(MAX), IIF(
                    c.HeaderText COLLATE Latin1_General_100_BIN2 LIKE N'%[,"' + NCHAR(13) + NCHAR(10) + N']%',
                    N'"' + REPLACE(c.HeaderText, N'"', N'""') + N'"',
                    c.HeaderText
                )),
                N','
            ) WITHIN GROUP (ORDER BY c.ColumnNo)
        FROM @Column AS c
        INNER JOIN @Value AS v ON c.ColumnNo = v.ColumnNo;

        SET @Sql = CONCAT(
            N'SELECT @out = STRING_AGG(CONVERT(NVARCHAR(MAX), CONCAT(', @RowExpr, N', N'''')), @crlf)
                WITHIN GROUP (ORDER BY r.mailq_row_no)
            FROM #DbMailResult AS r;'
        );
        EXEC sys.sp_executesql @Sql, N'@crlf NCHAR(2), @out NVARCHAR(MAX) OUTPUT', @crlf = @CrLf, @out = @Result OUTPUT;
        SET @Result = CONCAT(
            IIF(@Header = 1, CONCAT(@HeaderLine, @CrLf), N''),
            @Result, IIF(@Result IS NULL, N'', @CrLf)
        );
    END;

    RETURN 0;
END;
